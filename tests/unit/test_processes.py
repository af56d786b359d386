"""The pidfd registry: it signals the process it registered, and the members of that process's group
that belong to the same user, and never its own process group's other members."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from app.service.box.processes import Registry, RegistrationError, exited, owned_by

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def ended(process: subprocess.Popen, timeout: float = 10.0) -> bool:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def test_a_job_in_its_own_group_is_signalled_with_its_group():
    registry = Registry()
    leader = subprocess.Popen(SLEEP, process_group=0)
    member = subprocess.Popen(SLEEP, process_group=leader.pid)
    try:
        time.sleep(0.2)
        entry = registry.add("job", 1, os.getuid(), leader.pid)
        assert entry.pgid == leader.pid
        assert sorted(registry.signal(entry, signal.SIGTERM)) == sorted([leader.pid, member.pid])
        assert ended(leader) and ended(member)
    finally:
        for process in (leader, member):
            process.kill()
            process.wait()
        registry.close()


def test_a_job_beside_the_service_is_signalled_but_not_the_service_group():
    registry = Registry()
    job = subprocess.Popen(SLEEP)  # our own process group, as a job started beside the service would be
    bystander = subprocess.Popen(SLEEP)  # another process of that group: never signalled
    try:
        time.sleep(0.2)
        entry = registry.add("job", 1, os.getuid(), job.pid)
        assert entry.pgid == os.getpgrp()
        assert registry.signal(entry, signal.SIGTERM) == [job.pid]
        assert ended(job)
        assert bystander.poll() is None
    finally:
        for process in (job, bystander):
            process.kill()
            process.wait()
        registry.close()


def test_a_job_in_a_script_s_group_takes_its_children_but_not_the_script():
    registry = Registry()
    script = subprocess.Popen(SLEEP, process_group=0)  # the group's leader: a shell script, say
    # A job the script started in the background: the script's group, not its leader; it has a child.
    job = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time;"
                            " subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
                            " time.sleep(60)"], process_group=script.pid)
    try:
        time.sleep(0.5)
        entry = registry.add("job", 1, os.getuid(), job.pid)
        sent = registry.signal(entry, signal.SIGKILL)
        assert sent[0] == job.pid and len(sent) == 2  # the job, then its child
        assert ended(job)
        assert script.poll() is None  # the script that started it is not the job
    finally:
        for process in (script, job):
            process.kill()
            process.wait()
        registry.close()


def test_an_ended_process_is_swept_and_not_signalled():
    registry = Registry()
    job = subprocess.Popen(SLEEP)
    time.sleep(0.2)
    entry = registry.add("job", 1, os.getuid(), job.pid)
    job.kill()
    job.wait()
    assert registry.signal(entry, signal.SIGTERM) == []
    assert [gone.pid for gone in registry.sweep()] == [job.pid]
    assert registry.live() == []


def test_pid_1_and_a_process_of_someone_else_are_refused():
    registry = Registry()
    for pid, uid in ((1, 0), (os.getpid(), os.getuid() + 1)):
        try:
            registry.add("job", 1, uid, pid)
        except RegistrationError:
            continue
        raise AssertionError(f"registered pid {pid} for uid {uid}")


def test_an_ended_job_is_swept_as_done_and_a_live_one_stays():
    registry = Registry()
    job, other = subprocess.Popen(SLEEP), subprocess.Popen(SLEEP)
    try:
        entry = registry.add("job", 1, os.getuid(), job.pid)
        stays = registry.add("job", 1, os.getuid(), other.pid)
        assert registry.sweep() == [] and entry.done is False
        job.kill()
        job.wait()
        assert registry.sweep() == [entry] and entry.done is True  # a server's supervision reads `done`
        assert registry.live() == [stays] and stays.done is False
    finally:
        for process in (job, other):
            process.kill()
            process.wait()
        registry.close()


def test_jobs_of_a_booking_are_its_live_jobs_only():
    registry = Registry()
    mine, server, others, dead = (subprocess.Popen(SLEEP) for _ in range(4))
    try:
        registry.add("job", 1, os.getuid(), mine.pid)
        registry.add("server", 1, os.getuid(), server.pid)  # a llama-server supervisor is not a job
        registry.add("job", 2, os.getuid(), others.pid)
        registry.add("job", 1, os.getuid(), dead.pid)
        dead.kill()
        dead.wait()  # ended, not yet swept
        assert registry.jobs_of(1) == [mine.pid]
        assert registry.jobs_of(2) == [others.pid]
    finally:
        for process in (mine, server, others, dead):
            process.kill()
            process.wait()
        registry.close()


# A process that starts a child at each level until level 0, which names itself "a)" (a command name with the
# parenthesis /proc/PID/stat puts around it) and prints its parent's pid and its own.
CHAIN = ("import os, subprocess, sys, time\n"
         "level = int(sys.argv[1])\n"
         "if level:\n"
         "    subprocess.Popen([sys.executable, '-c', sys.argv[2], str(level - 1), sys.argv[2]])\n"
         "else:\n"
         "    with open('/proc/self/comm', 'w') as comm:\n"
         "        comm.write('a)')\n"
         "    print(os.getppid(), os.getpid(), flush=True)\n"
         "time.sleep(60)\n")


def test_a_job_s_grandchild_is_signalled_whatever_its_command_name():
    registry = Registry()
    script = subprocess.Popen(SLEEP, process_group=0)
    # A job in the script's group, not its leader: only what descends from it is the job's.
    job = subprocess.Popen([sys.executable, "-c", CHAIN, "2", CHAIN], process_group=script.pid,
                           stdout=subprocess.PIPE, text=True)
    try:
        child, grandchild = map(int, job.stdout.readline().split())
        entry = registry.add("job", 1, os.getuid(), job.pid)
        assert sorted(registry.signal(entry, signal.SIGKILL)) == sorted([job.pid, child, grandchild])
        assert ended(job) and script.poll() is None
    finally:
        os.killpg(script.pid, signal.SIGKILL)
        for process in (script, job):
            process.wait()
        registry.close()


def test_a_child_of_a_job_beside_the_service_is_in_the_service_s_group_and_not_signalled():
    registry = Registry()
    job = subprocess.Popen([sys.executable, "-c", CHAIN, "1", CHAIN], stdout=subprocess.PIPE, text=True)
    watch = None
    try:
        _, child = map(int, job.stdout.readline().split())
        watch = os.pidfd_open(child)
        entry = registry.add("job", 1, os.getuid(), job.pid)
        assert registry.signal(entry, signal.SIGKILL) == [job.pid]
        assert ended(job) and not exited(watch)
    finally:
        if watch is not None:
            signal.pidfd_send_signal(watch, signal.SIGKILL)
            os.close(watch)
        job.kill()
        job.wait()
        registry.close()


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another uid")
def test_processes_no_longer_the_holder_s_alone_are_not_signalled():
    """As root, without the real-users tier: a member of the job's group running as another uid, and a job
    that became another uid after it registered (as a setuid program would), are not the holder's."""
    registry = Registry()
    become = "import os, sys, time; sys.stdin.readline(); os.setresuid(%d, %d, %d); print('ok', flush=True);" \
             " time.sleep(60)" % (NOBODY, NOBODY, NOBODY)
    leader = subprocess.Popen(SLEEP, process_group=0)
    stranger = subprocess.Popen(["sleep", "60"], process_group=leader.pid, user=NOBODY)
    turncoat = subprocess.Popen([sys.executable, "-c", become], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    try:
        entry = registry.add("job", 1, os.getuid(), leader.pid)
        changed = registry.add("job", 2, os.getuid(), turncoat.pid)
        turncoat.stdin.write("go\n")
        turncoat.stdin.flush()
        assert turncoat.stdout.readline() == "ok\n"
        assert registry.signal(entry, signal.SIGKILL) == [leader.pid]
        assert registry.signal(changed, signal.SIGKILL) == []
        assert ended(leader) and stranger.poll() is None and turncoat.poll() is None
    finally:
        for process in (leader, stranger, turncoat):
            process.kill()
            process.wait()
        registry.close()


def test_a_refusal_says_why():
    registry = Registry()
    gone = subprocess.Popen(SLEEP)
    gone.kill()
    gone.wait()  # reaped: no such process
    ended_unreaped = subprocess.Popen(SLEEP)
    live = subprocess.Popen(SLEEP)
    try:
        ended_unreaped.kill()
        os.waitid(os.P_PID, ended_unreaped.pid, os.WEXITED | os.WNOWAIT)  # ended, still there to be reaped
        started = registry.add("job", 1, os.getuid(), live.pid).started_ticks
        for pid, uid, ticks, why in ((1, 0, None, "that process cannot be registered"),
                                     (gone.pid, os.getuid(), None, "the registering process has already ended"),
                                     (live.pid, os.getuid() + 1, None, "the registering process is not yours"),
                                     (ended_unreaped.pid, os.getuid(), None, "the registering process is not yours"),
                                     (live.pid, os.getuid(), started + 1, "the registering process is not yours")):
            with pytest.raises(RegistrationError) as refused:
                registry.add("job", 1, uid, pid, started_ticks=ticks)
            assert str(refused.value) == why, pid
        assert registry.add("job", 1, os.getuid(), live.pid, started_ticks=started).started_ticks == started
        assert not owned_by(gone.pid, os.getuid())
    finally:
        for process in (ended_unreaped, live):
            process.kill()
            process.wait()
        registry.close()


def test_a_job_with_a_parenthesis_in_its_name_is_read_right():
    """/proc/PID/stat puts the command name in parentheses; a name with one of its own must not shift the fields."""
    registry = Registry()
    script = subprocess.Popen(SLEEP, process_group=0)
    job = subprocess.Popen([sys.executable, "-c", CHAIN, "0", CHAIN], process_group=script.pid,
                           stdout=subprocess.PIPE, text=True)
    try:
        job.stdout.readline()  # named "a)" by now
        entry = registry.add("job", 1, os.getuid(), job.pid)
        assert entry.pgid == script.pid  # not its own: the script is not signalled with it
        with open("/proc/stat") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
        age = time.time() - boot - entry.started_ticks / os.sysconf("SC_CLK_TCK")
        assert -5 < age < 600  # it started moments ago (the bound is generous: a wrong field is years off, or 0)
        assert registry.signal(entry, signal.SIGKILL) == [job.pid]
        assert ended(job) and script.poll() is None
    finally:
        for process in (script, job):
            process.kill()
            process.wait()
        registry.close()
