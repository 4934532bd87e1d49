/* errtext.h: errno texts and signal names in the Python CLI's words.
 *
 * The Python CLI words an errno with os.strerror and a signal with
 * signal.Signals, i.e. as the libc Python runs on (glibc's words here). An
 * executable built with another libc (musl: "Out of memory" for ENOMEM,
 * "Symbolic link loop" for ELOOP...) takes them from tables generated at
 * build time from that Python (build_ffi.words_source, linked into the
 * executables, not into the module). */
#ifndef SANDBOX_ERRTEXT_H
#define SANDBOX_ERRTEXT_H

#include <stddef.h>

extern const char *const sbx_errno_texts[];
extern const int sbx_n_errno_texts;
extern const char *const sbx_signal_names[]; /* "SIGKILL"; NULL where Python names no signal */
extern const int sbx_n_signal_names;

/* The text of `err` ("Unknown error N" for one the table lacks, written
 * into `buf`). glibc's strerror_r where built with glibc. */
const char *sbx_strerror_r(int err, char *buf, size_t size);

/* The same in a static buffer, for the single-threaded executables. */
const char *sbx_strerror(int err);

#endif
