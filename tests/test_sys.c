/* File kinds (docs/files.md §4): sys_open_file, sys_check_replaceable and
 * sys_same_file over every kind of thing a path can name, in a table: each
 * mode takes a regular file only, writes never go through a symbolic link
 * (the link's target keeps its bytes), and nothing blocks (a FIFO without a
 * writer, a socket, a device are refused at once; the test would hang
 * otherwise). Also the descriptor's /proc name, which a rename of the path
 * cannot redirect. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/status.h"
#include "base/sys.h"
#include "test_util.h"

static void write_file(const char *name, const char *text) {
    FILE *f = fopen(test_path(name), "w");
    fputs(text, f);
    fclose(f);
}

static char *read_file(const char *name) {
    static char text[64];
    FILE *f = fopen(test_path(name), "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    return text;
}

/* A unix socket bound at `name` (the descriptor stays open for the test). */
static void make_socket(const char *name) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", test_path(name));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    test_check(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "a socket to refuse is made", NULL);
}

/* Every kind, freshly made (a write may have replaced or emptied it). */
static void make_kinds(void) {
    const char *names[] = {"regular", "link", "dangling", "fifo", "fifo_link", "dir", "dir_link", "sock", "target"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        unlink(test_path(names[i]));
        rmdir(test_path(names[i]));
    }
    write_file("regular", "regular bytes");
    write_file("target", "target bytes");
    symlink(test_path("target"), test_path("link"));
    symlink(test_path("nowhere"), test_path("dangling"));
    mkfifo(test_path("fifo"), 0644);
    symlink(test_path("fifo"), test_path("fifo_link"));
    mkdir(test_path("dir"), 0755);
    symlink(test_path("dir"), test_path("dir_link"));
    make_socket("sock");
}

enum { OK = 1, NO = 0 };

/* What each mode does with each kind: the class of docs/files.md §4 in one table. */
static const struct {
    const char *kind;
    int read, lock, replace, create, replaceable;
    const char *needle; /* in the message of a refusal ("" = any): what is there */
} CASES[] = {
    {"absent", NO, OK, OK, OK, OK, "No such file"}, {"regular", OK, OK, OK, NO, OK, "exists already"},
    {"link", OK, NO, NO, NO, NO, "symbolic link"},  {"dangling", NO, NO, NO, NO, NO, ""},
    {"fifo", NO, NO, NO, NO, NO, "FIFO"},           {"fifo_link", NO, NO, NO, NO, NO, ""},
    {"dir", NO, NO, NO, NO, NO, "directory"},       {"dir_link", NO, NO, NO, NO, NO, ""},
    {"sock", NO, NO, NO, NO, NO, "socket"},         {"/dev/null", NO, NO, NO, NO, NO, "character device"},
};

static const char *case_path(const char *kind) { return kind[0] == '/' ? kind : test_path(kind); }

static void check_open(const char *kind, sys_open_how how, const char *mode, int expected, const char *needle) {
    make_kinds();
    unlink(test_path("absent"));
    status st = {0};
    double start = sys_seconds();
    int fd = sys_open_file(case_path(kind), how, "test file", &st);
    double seconds = sys_seconds() - start;
    char name[96];
    snprintf(name, sizeof name, "%s of %s: %s", mode, kind, expected ? "opened" : "refused");
    bool ok = (fd >= 0) == (expected == OK) && seconds < 5;
    if (fd < 0)
        ok = ok && st.code == EXIT_BAD_FILE && strstr(st.message, case_path(kind)) && strstr(st.message, needle);
    test_check(ok, name, ok ? NULL : "fd %d in %.1f s: %s", fd, seconds, fd < 0 ? st.message : "");
    if (fd >= 0) {
        struct stat s;
        test_check(fstat(fd, &s) == 0 && S_ISREG(s.st_mode), "  the descriptor is a regular file's", NULL);
        if (how == SYS_REPLACE) test_check(s.st_size == 0, "  replace: the file is emptied", NULL);
        close(fd);
    }
    /* a link's target is never written through, whatever the mode */
    test_check(!strcmp(read_file("target"), "target bytes"), "  the link target keeps its bytes", NULL);
}

static void test_kinds(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const char *kind = CASES[i].kind;
        check_open(kind, SYS_READ, "read", CASES[i].read, CASES[i].needle);
        check_open(kind, SYS_LOCK, "lock", CASES[i].lock, CASES[i].needle);
        check_open(kind, SYS_REPLACE, "replace", CASES[i].replace, CASES[i].needle);
        check_open(kind, SYS_CREATE, "create", CASES[i].create, CASES[i].needle);
        make_kinds();
        status st;
        int rc = sys_check_replaceable(case_path(kind), &st);
        char name[96];
        snprintf(name, sizeof name, "rename onto %s: %s", kind, CASES[i].replaceable ? "allowed" : "refused");
        bool ok = (rc == 0) == (CASES[i].replaceable == OK);
        test_check(ok, name, ok ? NULL : "%s", rc ? st.message : "replaceable");
    }
}

/* The /proc name follows the descriptor, not the path: after the path is
 * renamed away and a link put in its place, the name still reaches the
 * file created, and sys_same_file sees the swap. */
static void test_descriptor_path(void) {
    make_kinds();
    unlink(test_path("new"));
    status st;
    int fd = sys_open_file(test_path("new"), SYS_CREATE, NULL, &st);
    if (!test_check(fd >= 0, "create a new file", fd < 0 ? "%s" : NULL, st.message)) return;
    test_check(sys_same_file(fd, test_path("new")), "the path is the file created", NULL);
    char buf[64];
    const char *name = sys_descriptor_path(fd, buf, sizeof buf);
    if (!name) {
        test_skip("the /proc name of a descriptor", "/proc is not mounted");
        close(fd);
        return;
    }
    rename(test_path("new"), test_path("moved"));
    symlink(test_path("target"), test_path("new"));
    test_check(!sys_same_file(fd, test_path("new")), "a link swapped in is seen", NULL);
    FILE *f = fopen(name, "w");
    if (f) {
        fputs("through the descriptor", f);
        fclose(f);
    }
    test_check(!strcmp(read_file("moved"), "through the descriptor") && !strcmp(read_file("target"), "target bytes"),
               "the /proc name writes the file created, not the link", NULL);
    close(fd);
    unlink(test_path("new"));
    unlink(test_path("moved"));
}

int main(void) {
    if (!test_scratch_make("test_sys")) return test_summary("test_sys");
    test_kinds();
    test_descriptor_path();
    test_scratch_remove();
    return test_summary("test_sys");
}
