#!/usr/bin/env bash
# Bulk stdout over TCP and TLS, builds side by side: for each round and
# each NAME=BINARY, `BINARY run --connect tcp:… [--tls-pin …] -- head -c
# SIZE /dev/zero | wc -c` against a `BINARY serve` of its own on loopback,
# printing the wall time, the client's CPU (/usr/bin/time) and the
# server's (/proc/PID/stat). The builds alternate, so a load that comes
# and goes falls on each alike; CPU figures mean more than wall times on a
# shared machine.
#
# With DIRECTION=stdin, the bytes go the other way and back: `head -c
# SIZE /dev/zero | BINARY run … -- cat | wc -c`; with DIRECTION=stdin-wc,
# only the other way: `head -c SIZE /dev/zero | BINARY run … -- wc -c`.
#
#   scripts/remote-bulk-ab.sh ROUNDS SIZE NAME=BINARY [NAME=BINARY...]
#   e.g. scripts/remote-bulk-ab.sh 3 268435456 before=/tmp/old/capexec after=target/release/capexec
set -euo pipefail
rounds=$1 size=$2
shift 2
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$dir/key.pem" -out "$dir/cert.pem" -days 2 2>/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/token"
chmod 600 "$dir/token" "$dir/key.pem"
pin=$(openssl x509 -in "$dir/cert.pem" -noout -fingerprint -sha256 | cut -d= -f2)
declare -A pid address
for spec in "$@"; do
    name=${spec%%=*} bin=${spec#*=}
    for mode in tcp tls; do
        tls=()
        [[ $mode == tls ]] && tls=(--tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem")
        "$bin" serve --listen tcp:127.0.0.1:0 --token-file "$dir/token" "${tls[@]}" \
            >"$dir/$name-$mode.out" 2>"$dir/$name-$mode.err" &
        pid[$name-$mode]=$!
    done
done
for key in "${!pid[@]}"; do
    for _ in $(seq 100); do
        grep -q "^tcp:" "$dir/$key.out" && break
        sleep 0.1
    done
    address[$key]=$(grep -m1 -o "^tcp:[0-9.]*:[0-9]*" "$dir/$key.out")
done
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for round in $(seq "$rounds"); do
    for spec in "$@"; do
        name=${spec%%=*} bin=${spec#*=}
        for mode in tcp tls; do
            trust=()
            [[ $mode == tls ]] && trust=(--tls-pin "$pin")
            before=$(cpu "${pid[$name-$mode]}")
            client=(/usr/bin/time -f "%e %U %S" "$bin" run --connect "${address[$name-$mode]}"
                --token-file "$dir/token" "${trust[@]}" --)
            if [[ ${DIRECTION:-stdout} == stdin ]]; then
                timed=$({ head -c "$size" /dev/zero | "${client[@]}" cat | wc -c >"$dir/count"; } 2>&1 |
                    tail -n 1)
            elif [[ ${DIRECTION:-stdout} == stdin-wc ]]; then
                timed=$({ head -c "$size" /dev/zero | "${client[@]}" wc -c >"$dir/count"; } 2>&1 |
                    tail -n 1)
            else
                timed=$({ "${client[@]}" head -c "$size" /dev/zero | wc -c >"$dir/count"; } 2>&1 |
                    tail -n 1)
            fi
            after=$(cpu "${pid[$name-$mode]}")
            read -r wall user system <<<"$timed"
            bytes=$(cat "$dir/count")
            [[ $bytes == "$size" ]] || { echo "$name $mode: $bytes of $size bytes" >&2; exit 1; }
            awk -v n="$name" -v m="$mode" -v r="$round" -v w="$wall" -v u="$user" -v s="$system" \
                -v t=$((after - before)) -v b="$bytes" -v hz="$(getconf CLK_TCK)" 'BEGIN {
                printf "%-8s %s round %s: %6.2f s, %7.1f MB/s, client CPU %5.2f s, server CPU %5.2f s\n",
                    n, m, r, w, b / w / 1e6, u + s, t / hz }'
        done
    done
done
