"""The CPUs this process may run on: its affinity mask and its container's CPU quota."""
import os
import re


def available_cpus():
    """CPUs this process may run on: its affinity mask (where the OS tells), and no more than
    its container's CPU quota allows (``cgroup_cpu_quota``)."""
    if hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return cpus if quota is None else max(1, min(cpus, quota))


def cgroup_cpu_quota(mountinfo="/proc/self/mountinfo", cgroups="/proc/self/cgroup"):
    """The CPUs this process's cgroup quota amounts to (quota over period, rounded up; the
    tightest of its cgroup and their ancestors'): cgroup v2's ``cpu.max``, v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, found through the mounts the process sees
    (a container's, in a cgroup namespace). None where no quota is set or none can be read
    (not Linux)."""
    try:
        with open(cgroups) as f:
            memberships = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
        with open(mountinfo) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    v2 = next((path for number, controllers, path in memberships
               if number == "0" and not controllers), None)
    v1 = next((path for _, controllers, path in memberships
               if "cpu" in controllers.split(",")), None)
    limits = []
    for fields in mounts:
        if "-" not in fields:
            continue
        dash = fields.index("-")
        fs_type, options = fields[dash + 1], (fields[dash + 3:dash + 4] or [""])[0]
        if fs_type == "cgroup2" and v2 is not None:
            path, read = v2, _cpu_max
        elif fs_type == "cgroup" and "cpu" in options.split(",") and v1 is not None:
            path, read = v1, _cfs_quota
        else:
            continue
        root, mount_point = (_unescape(field) for field in fields[3:5])
        relative = os.path.relpath(path, root)
        if relative.startswith(".."):    # the process's cgroup is outside this mount
            continue
        directory = os.path.normpath(os.path.join(mount_point, relative))
        while True:
            limits.append(read(directory))
            if directory == mount_point or len(directory) <= len(mount_point):
                break
            directory = os.path.dirname(directory)
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def _unescape(field):
    """A mountinfo path field: spaces and the like are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _read_words(path):
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return None


def _quota_cpus(quota, period):
    """CPUs of a quota of ``quota`` per ``period`` microseconds, rounded up; None when unset."""
    try:
        quota, period = int(quota), int(period)
    except ValueError:    # "max": no quota
        return None
    return -(-quota // period) if quota > 0 and period > 0 else None


def _cpu_max(directory):
    words = _read_words(os.path.join(directory, "cpu.max"))
    return _quota_cpus(*words[:2]) if words and len(words) >= 2 else None


def _cfs_quota(directory):
    quota = _read_words(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read_words(os.path.join(directory, "cpu.cfs_period_us"))
    return _quota_cpus(quota[0], period[0]) if quota and period else None
