#!/usr/bin/env python3
"""N concurrent `capexec run --connect tcp:… -n -- sleep 1` (mode `capexec`; `capexec-tls` over TLS, with a fresh P-256 certificate and `--tls-pin`) or `timeout 10 sleep 1` (mode `timeout`, the floor) against a TCP server of their own: wall time and the server's CPU.

Usage: scripts/concurrent-runs.py CAPEXEC_BINARY N [capexec|capexec-tls|timeout]
"""
import base64, os, shutil, subprocess, sys, tempfile, time
bin_, n = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "capexec"
if mode not in ("capexec", "capexec-tls", "timeout"):
    sys.exit(f"unknown mode {mode!r}: capexec, capexec-tls or timeout")
d = tempfile.mkdtemp()
tok = base64.b64encode(os.urandom(24)).decode()
open(f"{d}/token", "w").write(tok)
os.chmod(f"{d}/token", 0o600)
tls, pin = [], []
if mode == "capexec-tls":
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", f"{d}/key.pem", "-out", f"{d}/cert.pem", "-days", "2"],
                   check=True, capture_output=True)
    fingerprint = subprocess.run(["openssl", "x509", "-in", f"{d}/cert.pem", "-noout", "-fingerprint",
                                  "-sha256"], check=True, capture_output=True, text=True).stdout
    tls = ["--tls-cert", f"{d}/cert.pem", "--tls-key", f"{d}/key.pem"]
    pin = ["--tls-pin", fingerprint.strip().split("=", 1)[1]]
srv = subprocess.Popen([bin_, "serve", "--listen", "tcp:127.0.0.1:0", "--token-file", f"{d}/token",
                        "--max-pending-logins-per-address", str(n)] + tls, stdout=subprocess.PIPE,
                       stderr=open(f"{d}/log", "w"))
addr = srv.stdout.readline().decode().strip()
def cpu():
    f = open(f"/proc/{srv.pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
env = dict(os.environ, CAPEXEC_TOKEN=tok)
if mode.startswith("capexec"):
    argv = [bin_, "run", "--connect", addr] + pin + ["-n", "--", "sleep", "1"]
else:
    argv = ["timeout", "10", "sleep", "1"]
c0 = cpu(); t0 = time.monotonic()
kids = [subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for _ in range(n)]
spawned = time.monotonic() - t0
bad = sum(1 for k in kids if k.wait() != 0)
t1 = time.monotonic(); c1 = cpu()
print(f"{mode}: wall {t1-t0:.3f} s (spawning {spawned:.3f} s), server cpu {(c1-c0)/os.sysconf('SC_CLK_TCK'):.2f} s, failed {bad}")
srv.terminate(); srv.wait()
shutil.rmtree(d)
