"""The pidfd registry: it signals the process it registered, and the members of that process's group
that belong to the same user, and never its own process group's other members."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from app.service.processes import Registry, RegistrationError

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
