/* execpath.h: execvpe without malloc or errno, shared by the setup child
 * (util.c) and the freestanding reaper (init.c). */
#ifndef SANDBOX_EXECPATH_H
#define SANDBOX_EXECPATH_H

#define SBX_ENOENT 2
#define SBX_ENOTDIR 20
#define SBX_EACCES 13
#define SBX_ELOOP 40
#define SBX_ENAMETOOLONG 36
#define SBX_ENOEXEC 8

/* `exec` returns a negative errno (it only returns on failure). */
typedef long (*sbx_exec_fn)(const char *path, char *const argv[], char *const envp[]);

/* Exec `path`; a file the kernel does not recognize (ENOEXEC: a script
 * without "#!") is run by /bin/sh, as execvp does. `sh_argv` has room for
 * argc + 2 pointers (or is NULL: no retry). */
static inline long sbx_exec_one(const char *path, char *const argv[], char *const envp[], sbx_exec_fn exec,
                                char **sh_argv)
{
    long err = exec(path, argv, envp);
    if (err != -SBX_ENOEXEC || !sh_argv)
        return err;
    int n = 0;
    sh_argv[0] = (char *)"/bin/sh";
    sh_argv[1] = (char *)path;
    while (argv[n] && argv[n + 1]) {
        sh_argv[n + 2] = argv[n + 1];
        n++;
    }
    sh_argv[n + 2] = 0;
    exec("/bin/sh", sh_argv, envp);
    return err;
}

/* Try `file` in each entry of `path` (or as given if it has a '/'). `path`
 * is the plan's, never a default of ours; an empty entry is the current
 * directory, as for execvp. Returns the errno to report: EACCES if some
 * candidate existed but could not run. */
static inline int sbx_exec_path(const char *file, char *const argv[], char *const envp[], const char *path,
                                sbx_exec_fn exec, char **sh_argv)
{
    char buf[4096];
    int saw_eacces = 0;
    unsigned long flen = 0;
    while (file[flen]) {
        if (file[flen] == '/')
            return (int)-sbx_exec_one(file, argv, envp, exec, sh_argv);
        flen++;
    }
    const char *p = path ? path : "";
    for (;;) {
        const char *end = p;
        while (*end && *end != ':')
            end++;
        unsigned long dlen = (unsigned long)(end - p);
        if (dlen + flen + 3 <= sizeof buf) {
            char *w = buf;
            for (unsigned long i = 0; i < dlen; i++)
                *w++ = p[i];
            if (dlen == 0)
                *w++ = '.';
            *w++ = '/';
            for (unsigned long i = 0; i <= flen; i++)
                *w++ = file[i];
            int err = (int)-sbx_exec_one(buf, argv, envp, exec, sh_argv);
            if (err == SBX_EACCES)
                saw_eacces = 1;
            else if (err != SBX_ENOENT && err != SBX_ENOTDIR && err != SBX_ELOOP && err != SBX_ENAMETOOLONG)
                return err;
        }
        if (!*end)
            break;
        p = end + 1;
    }
    return saw_eacces ? SBX_EACCES : SBX_ENOENT;
}

#endif
