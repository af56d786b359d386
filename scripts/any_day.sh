#!/bin/sh
# Run a command with every process's wall clock moved to DATE, to show the suite does not depend on the day:
#
#   sudo scripts/any_day.sh '2026-12-09 10:00' .venv/bin/python -m pytest -p no:randomly tests/integration
#
# A tiny preloaded library (built here with cc) adds an offset to the wall clock (clock_gettime's CLOCK_REALTIME,
# gettimeofday, time), so the clock runs on from DATE and every process agrees; the monotonic clock, sleeps and
# timed waits stay the kernel's. Debian's faketime does not do here: faking the monotonic clock hangs Python's timed
# lock waits (sem_clockwait is not intercepted), and leaving it alone breaks time.sleep (EINVAL). The library is
# named in ld.so.preload of a private copy of /etc (a mount namespace of the command's own), so it reaches every
# process, also those a test starts with a clean environment (the agent under setpriv, `board` run as another
# user); useradd there writes to the copy. Root only (unshare, mount); never part of `make test`.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 'YYYY-MM-DD HH:MM[:SS]' COMMAND..." >&2; exit 2; }
target=$(date -d "$1" +%s) || { echo "$0: can't read the date '$1'" >&2; exit 2; }
shift
work=$(mktemp -d /tmp/any-day.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
cat >"$work/wallclock.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static long offset;  /* seconds added to the wall clock, from /etc/any-day-offset */
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void init(void) {
    FILE *f = fopen("/etc/any-day-offset", "r");
    if (f) {
        if (fscanf(f, "%ld", &offset) != 1) offset = 0;
        fclose(f);
    }
    real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) init();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset;
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    if (tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
EOF
cc -O2 -shared -fPIC -o "$work/wallclock.so" "$work/wallclock.c" -ldl
chmod 755 "$work/wallclock.so"
mkdir "$work/etc" && cp -a /etc/. "$work/etc"/
echo "$work/wallclock.so" >"$work/etc/ld.so.preload"
echo $((target - $(date +%s))) >"$work/etc/any-day-offset"
unshare --mount sh -c 'mount --bind "$1" /etc && shift && exec "$@"' sh "$work/etc" "$@"
