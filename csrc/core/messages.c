/* messages.c: a failure record in words, worded like bwrap's messages.
 *
 * The one wording of a setup failure, used by sandbox-launch (launcher.c)
 * and, through cffi, by the Python backend (which adds only the exception
 * class). It runs in the caller after the child is gone, never between
 * clone and exec, so stdio is fine here. The record names an op or a probe
 * path by index; the blob that failed supplies its paths.
 */
#include "internal.h"
#include "errtext.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *sbx_strerror_r(int err, char *buf, size_t size)
{
#ifdef __GLIBC__
    return strerror_r(err, buf, size); /* the GNU one: the text, seldom in buf */
#else
    if (err > 0 && err < sbx_n_errno_texts && sbx_errno_texts[err])
        return sbx_errno_texts[err];
    snprintf(buf, size, "Unknown error %d", err); /* glibc's and os.strerror's words */
    return buf;
#endif
}

const char *sbx_strerror(int err)
{
    static char buf[32];
    return sbx_strerror_r(err, buf, sizeof buf);
}

struct out {
    char *buf;
    size_t size, len;
};

static void __attribute__((format(printf, 2, 3))) put(struct out *o, const char *fmt, ...)
{
    if (o->len + 1 >= o->size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->size - o->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len = o->len + (size_t)n < o->size ? o->len + (size_t)n : o->size - 1;
}

/* A step name with spaces for underscores ("uid map"), or "step N". */
static void put_step(struct out *o, int step)
{
    const char *name = step >= 0 && step < sbx_n_steps ? sbx_step_names[step] : NULL;
    if (!name) {
        put(o, "step %d", step);
        return;
    }
    for (; *name; name++)
        put(o, "%c", *name == '_' ? ' ' : *name);
}

/* The blob's parts, or NULL where the blob (or the index) is not valid. */
struct plan_view {
    const char *blob;
    const struct sbx_header *h;
};

static struct plan_view view(const void *blob, size_t len)
{
    struct plan_view v = {NULL, NULL};
    if (blob && sbx_check_blob(blob, len) == 0) {
        v.blob = blob;
        v.h = blob;
    }
    return v;
}

static const char *str_at(struct plan_view v, uint32_t off)
{
    return off ? v.blob + off : NULL;
}

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

static const struct sbx_op *op_at(struct plan_view v, int index)
{
    if (!v.h || index < 0 || (uint32_t)index >= v.h->n_ops)
        return NULL;
    return (const struct sbx_op *)(v.blob + v.h->ops_off) + index;
}

static const char *u32_path(struct plan_view v, uint32_t off, uint32_t n, int index)
{
    if (!v.h || index < 0 || (uint32_t)index >= n)
        return NULL;
    return str_at(v, ((const uint32_t *)(const void *)(v.blob + off))[index]);
}

static const char *kind_name(uint32_t kind)
{
    return kind < (uint32_t)sbx_n_op_kinds && sbx_op_kind_names[kind] ? sbx_op_kind_names[kind] : "?";
}

/* What an operation was doing, as bwrap says it (bubblewrap.c setup_newroot). */
static void put_op(struct out *o, struct plan_view v, const struct sbx_op *op, int detail, int err)
{
    const char *dest = or_empty(str_at(v, op->dest)), *src = or_empty(str_at(v, op->src));
    switch (detail) {
    case SBX_D_SOURCE:
        if (op->kind == SBX_OP_BIND)
            put(o, "Can't find source path %s", src);
        else
            put(o, "Can't open %s", dest);
        return;
    case SBX_D_PARENTS:
        put(o, "Can't mkdir parents for %s", dest);
        return;
    case SBX_D_EXISTS:
        put(o, "Can't make symlink at %s: existing destination is not %s", dest, src);
        return;
    case SBX_D_CREATE:
        if (err == ENOTDIR && op->kind != SBX_OP_DIR && op->kind != SBX_OP_SYMLINK && op->kind != SBX_OP_FILE)
            put(o, "Can't mkdir %s", dest); /* a directory mount point, as bwrap's ensure_dir */
        else if (err == EISDIR && op->kind == SBX_OP_BIND)
            put(o, "Can't create file at %s", dest); /* a file mount point, as bwrap's ensure_file */
        else
            put(o, "Can't create %s at %s",
                op->kind == SBX_OP_DIR ? "directory" : op->kind == SBX_OP_SYMLINK ? "symlink"
                : op->kind == SBX_OP_FILE ? "file" : "mount point", dest);
        return;
    case SBX_D_RESOLVE:
        put(o, "Can't open %s inside the sandbox", dest);
        return;
    case SBX_D_WRITE:
        put(o, "Can't write file at %s", dest);
        return;
    case SBX_D_CHMOD:
        put(o, "Can't chmod %o %s", op->mode, dest);
        return;
    case SBX_D_ATTR:
        if (op->kind == SBX_OP_REMOUNT_RO)
            put(o, "Can't remount readonly on %s", dest);
        else
            put(o, "Can't set mount flags on %s", dest);
        return;
    default:
        if (op->kind == SBX_OP_BIND)
            put(o, "Can't bind mount %s on %s", src, dest);
        else
            put(o, "Can't mount %s on %s", kind_name(op->kind), dest);
    }
}

static void put_cwd(struct out *o, struct plan_view v)
{
    const char *first = v.h ? u32_path(v, v.h->cwd_off, v.h->n_cwd, 0) : NULL;
    if (first && (v.h->opts & SBX_OPT_CWD_STRICT)) {
        put(o, "Can't chdir to %s", first);
        return;
    }
    put(o, "Can't chdir to any of ");
    for (uint32_t i = 0; v.h && i < v.h->n_cwd; i++)
        put(o, "%s%s", i ? ", " : "", u32_path(v, v.h->cwd_off, v.h->n_cwd, (int)i));
}

const char *sbx_format_error(const struct sbx_result *res, const void *blob, size_t len, const char *command,
                             char *buf, size_t size)
{
    struct out o = {buf, size, 0};
    struct plan_view v = view(blob, len);
    char reason[256];
    const char *why = res->err ? sbx_strerror_r(res->err, reason, sizeof reason) : "unknown error";
    if (size)
        buf[0] = 0;
    switch (res->step) {
    case SBX_STEP_EXEC:
        put(&o, "execvp %s", command ? command : "");
        break;
    case SBX_STEP_ISOLATION: {
        const char *probe = v.h ? u32_path(v, v.h->probe_off, v.h->n_probe, res->op) : NULL;
        put(&o, "isolation check failed: probe path %s ", probe ? probe : "?");
        if (res->err == EEXIST)
            put(&o, "is visible inside the sandbox");
        else
            put(&o, "cannot be proven absent (%s)", why);
        return buf;
    }
    case SBX_STEP_LOCK_FILE: {
        const char *lock = v.h ? u32_path(v, v.h->lock_off, v.h->n_lock, res->op) : NULL;
        put(&o, "Unable to lock file %s", lock ? lock : "?"); /* bwrap's words */
        break;
    }
    case SBX_STEP_SOURCE:
    case SBX_STEP_OP: {
        const struct sbx_op *op = op_at(v, res->op);
        if (op)
            put_op(&o, v, op, res->detail, res->err);
        else
            put(&o, "Can't apply a mount operation");
        break;
    }
    case SBX_STEP_CWD:
        put_cwd(&o, v);
        break;
    case SBX_STEP_UID_MAP:
    case SBX_STEP_GID_MAP:
    case SBX_STEP_SETGROUPS:
        put(&o, "setting up ");
        put_step(&o, res->step);
        break;
    case SBX_STEP_CLONE:
        put(&o, "Creating new namespace failed");
        if (res->err == ENOSPC) /* clone(2): a per-user namespace count or the nesting depth (32) */
            put(&o, " (a namespace limit was reached: raise the user.max_*_namespaces sysctl at its limit, "
                    "e.g. `sysctl -w user.max_user_namespaces=N`, or end other sandboxes; nesting stops at "
                    "32 levels)");
        else if (res->err == EPERM || res->err == EACCES)
            put(&o, " (user namespaces blocked? see `python -m sandbox probe`)");
        break;
    case SBX_STEP_CONFIG:
        put(&o, "The serialized plan is malformed");
        break;
    case SBX_STEP_USERNS2:
        put(&o, "Setting userns2 failed");
        break;
    default:
        put(&o, "Can't set up the sandbox (");
        put_step(&o, res->step);
        put(&o, ")");
    }
    put(&o, ": %s", why);
    return buf;
}

const char *sbx_error_path(const struct sbx_result *res, const void *blob, size_t len)
{
    struct plan_view v = view(blob, len);
    if (!v.h)
        return NULL;
    switch (res->step) {
    case SBX_STEP_SOURCE:
    case SBX_STEP_OP: {
        const struct sbx_op *op = op_at(v, res->op);
        if (!op)
            return NULL;
        if (res->detail == SBX_D_SOURCE && op->src)
            return str_at(v, op->src);
        return str_at(v, op->dest);
    }
    case SBX_STEP_CWD:
        return (v.h->opts & SBX_OPT_CWD_STRICT) ? u32_path(v, v.h->cwd_off, v.h->n_cwd, 0) : NULL;
    case SBX_STEP_ISOLATION:
        return u32_path(v, v.h->probe_off, v.h->n_probe, res->op);
    case SBX_STEP_LOCK_FILE:
        return u32_path(v, v.h->lock_off, v.h->n_lock, res->op);
    default:
        return NULL;
    }
}
