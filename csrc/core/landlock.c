/* landlock.c: a second wall behind the mount namespace.
 *
 * Landlock (an LSM an unprivileged process may stack on itself once
 * NO_NEW_PRIVS is set) restricts file access by path hierarchy: a ruleset
 * "handles" a set of access rights, and each rule grants some of them
 * beneath one directory (or on one file). Everything handled and not granted
 * is denied, whatever the mounts allow. The rights known to a kernel grow
 * with its Landlock ABI, so the handled set is built from the ABI it reports.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* rights added after the kernel headers this may be built with */
#define LL_REFER (1ULL << 13)      /* ABI 2 */
#define LL_TRUNCATE (1ULL << 14)   /* ABI 3 */
#define LL_IOCTL_DEV (1ULL << 15)  /* ABI 5 */
#define LL_ABI1 ((1ULL << 13) - 1) /* EXECUTE .. MAKE_SYM */
#define LL_READ (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR)
#define LL_FILE_ONLY (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE | \
                      LL_TRUNCATE | LL_IOCTL_DEV)

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
};

struct ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

static uint64_t handled_for(int abi)
{
    uint64_t all = LL_ABI1;
    if (abi >= 2)
        all |= LL_REFER;
    if (abi >= 3)
        all |= LL_TRUNCATE;
    if (abi >= 5)
        all |= LL_IOCTL_DEV;
    return all;
}

static void add_rule(struct sbx_ctx *c, int ruleset, int fd, uint64_t access, int index)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        sbx_fail(c, SBX_STEP_LANDLOCK, index, errno, SBX_D_RESOLVE);
    if (!S_ISDIR(st.st_mode))
        access &= LL_FILE_ONLY; /* directory rights on a file are EINVAL */
    struct ll_path_beneath rule = {.allowed_access = access, .parent_fd = fd};
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) < 0)
        sbx_fail(c, SBX_STEP_LANDLOCK, index, errno, SBX_D_NONE);
}

void sbx_apply_landlock(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    if (!(h->opts & SBX_OPT_LANDLOCK))
        return;
    int abi = (int)syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0) {
        if (h->opts & SBX_OPT_LANDLOCK_BEST_EFFORT)
            return;
        sbx_fail(c, SBX_STEP_LANDLOCK, -1, errno, SBX_D_NONE);
    }
    uint64_t all = handled_for(abi);
    struct ll_ruleset_attr attr = {.handled_access_fs = all};
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (ruleset < 0)
        sbx_fail(c, SBX_STEP_LANDLOCK, -1, errno, SBX_D_NONE);
    const struct sbx_landlock *rules = (const void *)(c->in.blob + h->landlock_off);
    for (uint32_t i = 0; i < h->n_landlock; i++) {
        int fd = open(sbx_str(c, rules[i].path), O_PATH | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT)
            continue; /* an optional bind whose source was missing */
        if (fd < 0)
            sbx_fail(c, SBX_STEP_LANDLOCK, (int)i, errno, SBX_D_RESOLVE);
        add_rule(c, ruleset, fd, (rules[i].flags & SBX_LL_WRITE) ? all : LL_READ, (int)i);
        close(fd);
    }
    /* the reaper is exec'd from an fd outside every declared path */
    if (c->in.init_fd >= 0 && (h->opts & SBX_OPT_REAPER))
        add_rule(c, ruleset, c->in.init_fd, LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE, -1);
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0)
        sbx_fail(c, SBX_STEP_LANDLOCK, -1, errno, SBX_D_NONE);
    close(ruleset);
    c->res->landlock_abi = abi;
}
