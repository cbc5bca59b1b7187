#!/usr/bin/env bash
# Checks that this machine has what capexec's confinement tests exercise:
# root, Landlock ABI 6 or later, seccomp filters, a writable cgroup2
# hierarchy with cgroup.kill, and the memory, pids and cpu controllers
# (cgroup2 or v1). Fails loudly, naming what is missing.
set -euo pipefail
missing=()
[ "$(id -u)" -eq 0 ] || missing+=("root (the tests drop a root child's capabilities)")
abi=$(python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(444, None, 0, 1))' 2>/dev/null || echo -1)
if [ "${abi:--1}" -lt 6 ]; then
    missing+=("Landlock ABI 6 or later (found ${abi}; Linux 6.12 with landlock in lsm=)")
fi
grep -q '^Seccomp:' /proc/self/status || missing+=("seccomp")
cgroup2=$(awk '$9 == "cgroup2" { print $5; exit }' /proc/self/mountinfo)
if [ -z "$cgroup2" ]; then
    missing+=("a cgroup2 hierarchy")
else
    own=$(sed -n 's/^0:://p' /proc/self/cgroup)
    probe="$cgroup2${own%/}/capexec-ci-probe-$$"
    if mkdir "$probe" 2>/dev/null; then
        [ -e "$probe/cgroup.kill" ] || missing+=("cgroup.kill (Linux 5.14)")
        rmdir "$probe"
    else
        missing+=("a writable cgroup2 hierarchy at $cgroup2$own")
    fi
fi
for controller in memory pids cpu; do
    if ! grep -qw "$controller" "$cgroup2/cgroup.controllers" 2>/dev/null \
        && ! awk -v c="$controller" '$9 == "cgroup" { n = split($NF, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) found = 1 } END { exit !found }' /proc/self/mountinfo; then
        missing+=("the $controller controller (cgroup2 or v1)")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    printf 'this machine cannot run the confinement tests; missing:\n' >&2
    printf '  - %s\n' "${missing[@]}" >&2
    exit 1
fi
echo "landlock ABI $abi, seccomp, cgroup2 at $cgroup2, controllers memory pids cpu"
