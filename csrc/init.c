/* init.c: sandbox-init, the pid 1 of a sandbox's pid namespace.
 *
 * The child that set the sandbox up shares its caller's memory, so it execs
 * this small static program instead of staying resident:
 *     sandbox-init ERR_FD STATUS_FD PATH -- COMMAND [ARGS...]
 * It forks COMMAND (reporting an exec failure on ERR_FD, as the setup child
 * would), forwards the signals it receives to COMMAND, reaps every orphan
 * re-parented to it, and when COMMAND ends writes its raw wait status to
 * STATUS_FD and exits. The death of pid 1 makes the kernel SIGKILL every
 * other process of the namespace, so nothing outlives the command.
 * Signals from inside the namespace cannot kill pid 1 (the kernel drops
 * those it has no handler for), so the status pipe, not our own exit
 * status, carries "killed by signal N" out.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int parse_fd(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= 0 && v < 65536) ? (int)v : -1;
}

static _Noreturn void run_command(int err_fd, const char *path, char **argv)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    sbx_exec_search(argv[0], argv, environ, path);
    sbx_report_fd(err_fd, SBX_STEP_EXEC, -1, errno, SBX_D_NONE);
    _exit(errno == ENOENT ? 127 : 126);
}

/* Wait for signals: reap on SIGCHLD, forward everything else to the command. */
static _Noreturn void reap(pid_t command, int status_fd)
{
    sigset_t all;
    sigfillset(&all);
    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&all, &si);
        if (sig < 0)
            continue;
        if (sig != SIGCHLD) {
            kill(command, sig);
            continue;
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            if (pid != command)
                continue;
            sbx_write_all(status_fd, &status, sizeof status);
            _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 6 || argv[4][0] != '-' || argv[4][1] != '-')
        return 125;
    int err_fd = parse_fd(argv[1]), status_fd = parse_fd(argv[2]);
    if (err_fd < 0 || status_fd < 0)
        return 125;
    fcntl(err_fd, F_SETFD, FD_CLOEXEC);
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    /* every signal stays blocked here (the setup child blocked them); they
     * are taken synchronously with sigwaitinfo() */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    pid_t command = fork();
    if (command < 0) {
        sbx_report_fd(err_fd, SBX_STEP_FORK, -1, errno, SBX_D_NONE);
        return 125;
    }
    if (command == 0)
        run_command(err_fd, argv[3], argv + 5);
    /* Keep only the status pipe: the command's stdio and passed fds must
     * reach EOF when the command (not this reaper) closes them. */
    for (int fd = 0; fd < 3; fd++)
        close(fd);
    if (status_fd > 3)
        syscall(SYS_close_range, 3, (unsigned)status_fd - 1, 0);
    syscall(SYS_close_range, (unsigned)status_fd + 1, ~0U, 0);
    reap(command, status_fd);
}
