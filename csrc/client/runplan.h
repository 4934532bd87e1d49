/* runplan.h: start a serialized plan (csrc/core/sandbox.h's blob) as a child of
 * this process, pass the signals this process receives on to it, and wait
 * for its command's status. What sandbox-launch (launcher.c) and the CLI
 * client running a plan its server compiled (cliplan.c) share. Runs in a
 * client program of its own, never in a sandbox's setup child.
 */
#ifndef SBX_RUNPLAN_H
#define SBX_RUNPLAN_H

#include <stddef.h>

#include "sandbox.h"

struct sbx_plan_run {
    const void *blob; /* 8-aligned; sbx_spawn checks it whole (sbx_check_blob) */
    size_t len;
    char *const *argv, *const *envp;
    const int *pass_fds; /* open at their numbers in the command */
    int n_pass;
    int init_fd; /* sandbox-init (O_PATH), for a plan with a reaper; else -1 */
};

/* From now on each of `sigs` is passed to the sandbox's first process (its
 * reaper passes it to the command); one that comes before the sandbox
 * exists is held, and passed once it does. */
void sbx_forward_signals(const int *sigs, size_t n);

/* Start the plan with the caller's own stdio: 0, or -1 with `res` saying
 * which step failed (sbx_format_error words it). */
int sbx_run_plan(const struct sbx_plan_run *run, struct sbx_result *res);

/* The command's wait status once it has ended: as the reaper reports it
 * (once every other process of the sandbox has gone: the namespaces'
 * teardown is left to whoever inherits the reaper), else the first
 * process's own. -1 if it cannot be waited for (errno). */
int sbx_wait_plan(const struct sbx_result *res);

#endif
