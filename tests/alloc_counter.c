/* An LD_PRELOAD library for tests/e2e/test_allocations.py: counts the
 * allocations momfmm's own code makes and their bytes, to hold it to "no
 * per-step allocation" and to memory linear in the sequence length
 * (docs/design.md §8.10). Each call of malloc, calloc, realloc,
 * posix_memalign, aligned_alloc, memalign, valloc or mmap is charged to
 * its nearest caller outside the C library and this file: when that
 * caller lies in the momfmm executable (all of momfmm's code is linked
 * into it), the call is counted at that site (below). What the libraries
 * allocate for themselves (Open MPI, HDF5, oneDNN, OpenBLAS, libgomp) is
 * theirs and is not counted here. The bytes are those asked for (calloc's
 * product, realloc's new size, mmap's length).
 *
 * At exit each process writes one line per site, "offset via-offset calls
 * bytes largest" (offsets from the executable's load address, as
 * addr2line reads them; via 0 when the next caller is not in the
 * executable), to $MOMFMM_ALLOC_COUNTS/allocs.<rank> (Open MPI's rank of
 * the process, 0 outside mpirun). The test compares runs of N and 2N
 * steps, and of sequence lengths T and 2T.
 *
 * The allocators are glibc's own entry points (__libc_malloc and the
 * rest), so nothing here needs dlsym, which itself allocates. */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t alignment, size_t size);
void *__libc_valloc(size_t size);

/* Address ranges of the executable, the C library and this file. */
#define MAX_RANGES 16
typedef struct {
    uintptr_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n;
} ranges;

static ranges executable, libc_and_self;
static uintptr_t executable_base;
static int ready; /* set once the ranges are known */

/* Per calling site, how many allocations; open addressing. A site is the
 * nearest caller in the executable and the caller in the executable after
 * it, so that a call through a wrapper (sys_calloc) is told by the
 * wrapper's caller. */
#define SLOTS 4096
typedef struct {
    uintptr_t at, via;
} site;
static site slot_site[SLOTS];
static long slot_count[SLOTS];
static unsigned long long slot_bytes[SLOTS], slot_largest[SLOTS];
static long unplaced; /* calls that found the table full */
static char table_lock;

static __thread int inside __attribute__((tls_model("initial-exec"))); /* this thread is already in a counted call */

static int in_ranges(const ranges *r, uintptr_t a) {
    for (int i = 0; i < r->n; i++)
        if (a >= r->lo[i] && a < r->hi[i]) return 1;
    return 0;
}

static void add_segments(ranges *r, const struct dl_phdr_info *info) {
    for (int i = 0; i < info->dlpi_phnum && r->n < MAX_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        r->lo[r->n] = info->dlpi_addr + ph->p_vaddr;
        r->hi[r->n] = r->lo[r->n] + ph->p_memsz;
        r->n++;
    }
}

static int find_objects(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    uintptr_t self = (uintptr_t)data;
    if (info->dlpi_name[0] == '\0' && executable.n == 0) { /* the first object: the executable */
        executable_base = info->dlpi_addr;
        add_segments(&executable, info);
        return 0;
    }
    ranges mine = {0};
    add_segments(&mine, info);
    if (strstr(info->dlpi_name, "/libc.so") || in_ranges(&mine, self)) add_segments(&libc_and_self, info);
    return 0;
}

static bool same_site(site a, site b) { return a.at == b.at && a.via == b.via; }

static void count_at(site s, size_t bytes) {
    while (__atomic_test_and_set(&table_lock, __ATOMIC_ACQUIRE)) {}
    size_t i = ((s.at ^ (s.via << 7)) >> 4) % SLOTS, probes = 0;
    while (slot_site[i].at && !same_site(slot_site[i], s) && probes < SLOTS) i = (i + 1) % SLOTS, probes++;
    if (probes == SLOTS) unplaced++;
    else {
        slot_site[i] = s, slot_count[i]++, slot_bytes[i] += bytes;
        if (bytes > slot_largest[i]) slot_largest[i] = bytes;
    }
    __atomic_clear(&table_lock, __ATOMIC_RELEASE);
}

/* Charge one call to its nearest caller outside the C library and this
 * file, if that caller is the executable. */
static void charge(size_t bytes) {
    if (!ready || inside) return;
    inside = 1;
    void *frames[48];
    int n = backtrace(frames, 48);
    for (int i = 1; i < n; i++) {
        uintptr_t a = (uintptr_t)frames[i];
        if (in_ranges(&libc_and_self, a)) continue;
        if (in_ranges(&executable, a)) {
            uintptr_t via =
                i + 1 < n && in_ranges(&executable, (uintptr_t)frames[i + 1]) ? (uintptr_t)frames[i + 1] : 0;
            count_at((site){a, via}, bytes);
        }
        break;
    }
    inside = 0;
}

void *malloc(size_t size) {
    charge(size);
    return __libc_malloc(size);
}

void *calloc(size_t count, size_t size) {
    charge(size && count > SIZE_MAX / size ? SIZE_MAX : count * size);
    return __libc_calloc(count, size);
}

void *realloc(void *p, size_t size) {
    charge(size);
    return __libc_realloc(p, size);
}

void *memalign(size_t alignment, size_t size) {
    charge(size);
    return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
    charge(size);
    return __libc_memalign(alignment, size);
}

void *valloc(size_t size) {
    charge(size);
    return __libc_valloc(size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment == 0 || alignment % sizeof(void *) || (alignment & (alignment - 1))) return EINVAL;
    charge(size);
    int saved = errno;
    void *p = __libc_memalign(alignment, size);
    if (!p) return ENOMEM;
    errno = saved;
    *out = p;
    return 0;
}

/* mmap by its system call, so that this wrapper needs no other symbol. */
void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    charge(length);
    long r = syscall(SYS_mmap, addr, length, prot, flags, fd, offset);
    return (void *)r;
}

__attribute__((constructor)) static void start(void) {
    inside = 1;
    void *warm[4];
    backtrace(warm, 4); /* loads the unwinder now, not inside a counted call */
    dl_iterate_phdr(find_objects, (void *)(uintptr_t)&start);
    ready = executable.n > 0 && libc_and_self.n > 0;
    inside = 0;
}

__attribute__((destructor)) static void finish(void) {
    const char *dir = getenv("MOMFMM_ALLOC_COUNTS");
    if (!ready || !dir) return;
    inside = 1;
    char path[4096], line[160];
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    snprintf(path, sizeof path, "%s/allocs.%s", dir, rank ? rank : "0");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    bool written = true;
    for (size_t i = 0; i < SLOTS && written; i++) {
        if (!slot_site[i].at) continue;
        uintptr_t via = slot_site[i].via ? slot_site[i].via - executable_base : 0;
        int k = snprintf(line, sizeof line, "0x%lx 0x%lx %ld %llu %llu\n",
                         (unsigned long)(slot_site[i].at - executable_base), (unsigned long)via, slot_count[i],
                         slot_bytes[i], slot_largest[i]);
        written = write(fd, line, (size_t)k) == k;
    }
    if (unplaced && written) { /* the test refuses a file with this line */
        int k = snprintf(line, sizeof line, "unplaced %ld\n", unplaced);
        written = write(fd, line, (size_t)k) == k;
    }
    close(fd);
    if (!written) unlink(path); /* a missing file fails the test; a short one might pass it */
}
