/* report.h: the failure record a setup process writes to its close-on-exec
 * error pipe before it exits: the setup child (child.c), the joiner, and
 * sandbox-init when the command cannot be forked or exec'd (init.c). The
 * parent reads it into struct sbx_result (spawn.c). An EOF without a record
 * means the pipe was closed by a successful exec. */
#ifndef SANDBOX_REPORT_H
#define SANDBOX_REPORT_H

#include <stdint.h>

struct sbx_report {
    int32_t step;   /* enum sbx_step */
    int32_t op;     /* index of the failing op (or probe path, rlimit ...), or -1 */
    int32_t err;    /* errno */
    int32_t detail; /* enum sbx_detail */
};

#endif
