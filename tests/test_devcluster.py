"""The dev cluster is REAL: real slurmctld/slurmd/slurmdbd/sshd, real jobs, no mocks.

That Slurm enforces a time limit (a 1-minute job ends TIMEOUT after 60-90 s) is checked once,
through the executor, by tests/test_slurm_executor.py::test_timeout.
"""
import re
import socket
import sys
import time

import paramiko
import pyotp
import pytest
from devcluster import run, sbatch, wait_for_job, wait_for_squeue

pytestmark = pytest.mark.usefixtures("devcluster")

QUIET = ["-o", "/dev/null", "-e", "/dev/null"]


def test_cluster_description(devcluster):
    assert devcluster["cluster_name"] == "devcluster"
    parts = {p["name"]: p for p in devcluster["partitions"]}
    assert parts["batch"]["nodes"] == ["n1", "n2"] and parts["batch"]["default"] is True
    assert parts["batch"]["gpu_type"] == "h200" and parts["batch"]["arch"] == "x86_64"
    assert parts["gb200"]["nodes"] == ["g1", "g2"] and parts["gb200"]["default"] is False
    assert parts["gb200"]["gpu_type"] == "gb200" and parts["gb200"]["arch"] == "aarch64"
    assert all(p["gpus_per_node"] == 4 for p in parts.values())
    assert devcluster["accounts"] == ["acct_a", "acct_b"] and devcluster["default_account"] == "acct_a"
    ssh = devcluster["ssh"]
    assert (ssh["port_key"], ssh["port_otp"], ssh["host"]) == (2222, 2223, "127.0.0.1")
    assert devcluster["slurm_conf"] == "/etc/slurm/slurm.conf"

    out = run(["sinfo", "-h", "-o", "%P|%N|%G|%f"]).stdout.split()
    assert "batch*|n[1-2]|gpu:h200:4|x86_64" in out
    assert "gb200|g[1-2]|gpu:gb200:4|aarch64" in out
    assocs = run(["sacctmgr", "-n", "-P", "show", "assoc", "cluster=devcluster", "format=account,user"]).stdout.split()
    assert {"acct_a|root", "acct_b|root", "acct_b|testuser"} <= set(assocs)
    assert "acct_a|testuser" not in assocs


def test_two_node_h200_job_sees_4_gpus_per_node():
    r = run(["srun", "-N2", "--ntasks-per-node=1", "--gres=gpu:h200:4", "-t", "2", "bash", "-c",
             'echo "NODE=$SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L | sed "s/^/$SLURMD_NODENAME /"'],
            timeout=120)
    lines = r.stdout.splitlines()
    cvd = dict(re.findall(r"^NODE=(\S+) CVD=(\S*)$", r.stdout, re.M))
    assert cvd == {"n1": "0,1,2,3", "n2": "0,1,2,3"}, r.stdout
    uuids = set()
    for node in ("n1", "n2"):
        gpus = [line.split(" ", 1)[1] for line in lines if line.startswith(node + " ")]
        assert len(gpus) == 4, r.stdout
        for i, g in enumerate(gpus):
            m = re.fullmatch(rf"GPU {i}: NVIDIA H200 \(UUID: (GPU-[0-9a-f-]{{36}})\)", g)
            assert m, g
            uuids.add(m.group(1))
    assert len(uuids) == 8  # each fake GPU has its own stable UUID


def test_gb200_batch_script_sees_gb200(tmp_path):
    out = tmp_path / "gb200.out"
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n"
                      'echo "NODE=$SLURMD_NODENAME CVD=$CUDA_VISIBLE_DEVICES"\n'
                      "nvidia-smi -L\n"
                      "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader\n"
                      "nvidia-smi --query-gpu=name --format=csv,noheader\n"
                      "nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv,noheader\n"
                      "echo apps-rc=$?\n"
                      "command -v nvidia-smi\n")
    job = sbatch("-p", "gb200", "--gres=gpu:gb200:2", "-t", "2", "-o", str(out), str(script))
    assert wait_for_job(job, 60) == ("COMPLETED", "0:0"), out.read_text()
    text = out.read_text().splitlines()
    assert re.fullmatch(r"NODE=g[12] CVD=0,1", text[0]), text
    assert re.fullmatch(r"GPU 0: NVIDIA GB200 \(UUID: GPU-[0-9a-f-]{36}\)", text[1]), text
    assert re.fullmatch(r"GPU 1: NVIDIA GB200 \(UUID: GPU-[0-9a-f-]{36}\)", text[2]), text
    assert text[3:5] == ["NVIDIA GB200, 189471 MiB"] * 2
    assert text[5:7] == ["NVIDIA GB200"] * 2
    assert text[7] == "apps-rc=0"  # compute-apps printed nothing at all
    assert text[8].endswith("/fakebin/nvidia-smi") and not text[8].startswith("/usr/")


def test_fake_nvidia_smi_memory_and_no_gpus():
    r = run(["srun", "-t", "1", "--gres=gpu:h200:1", "nvidia-smi",
             "--query-gpu=name,memory.total", "--format=csv,noheader"], timeout=60)
    assert r.stdout.splitlines() == ["NVIDIA H200, 143771 MiB"]
    r = run(["srun", "-t", "1", "bash", "-c", "nvidia-smi -L; echo rc=$?"], timeout=60)
    assert "GPU " not in r.stdout and "rc=6" in r.stdout  # no GPUs requested: none listed


def test_completed():
    job = sbatch(*QUIET, "--wrap", "true")
    assert wait_for_job(job, 60) == ("COMPLETED", "0:0")
    acct = run(["sacct", "-X", "-n", "-P", "-j", job, "--format=Account,User"]).stdout.split()
    assert acct == ["acct_a|root"]  # root's default account
    assert run(["scontrol", "show", "job", job]).stdout.count("Partition=batch ") == 1  # default partition


def test_failed_exit_3():
    job = sbatch(*QUIET, "--wrap", "exit 3")
    assert wait_for_job(job, 60) == ("FAILED", "3:0")


def test_cancelled():
    job = sbatch(*QUIET, "--wrap", "sleep 300")
    wait_for_squeue(job, lambda s: s[0] == "RUNNING", timeout=60)
    run(["scancel", job])
    state, _code = wait_for_job(job, 60)
    assert state == "CANCELLED"


def test_out_of_memory():
    py = f"{sys.executable} -c 'x = b\"\\x01\" * (400 * 1024 * 1024); print(len(x))'"
    job = sbatch(*QUIET, "--mem=50M", "--wrap", py)
    state, _code = wait_for_job(job, 90)
    assert state == "OUT_OF_MEMORY"


def test_pending_reason_resources():
    holder = sbatch("-p", "gb200", "-N2", "--gres=gpu:gb200:4", *QUIET, "--wrap", "sleep 300")
    waiter = None
    try:
        wait_for_squeue(holder, lambda s: s[0] == "RUNNING", timeout=90)
        waiter = sbatch("-p", "gb200", "--gres=gpu:gb200:1", *QUIET, "--wrap", "true")
        # the reason reads "None" until the scheduler's first pass (~1 s): poll for it
        st = wait_for_squeue(waiter, lambda s: s[1] != "None", timeout=30)
        assert st == ("PENDING", "Resources")
    finally:
        run(["scancel", holder] + ([waiter] if waiter else []), check=False)


def test_unknown_account_rejected():
    r = run(["sbatch", "-A", "nosuch", *QUIET, "--wrap", "true"], check=False)
    assert r.returncode != 0
    assert "Invalid account" in r.stderr


def test_testuser_only_in_acct_b():
    as_test = ["runuser", "-u", "testuser", "--", "sbatch", "--parsable", "-D", "/tmp", *QUIET]
    r = run(as_test + ["-A", "acct_a", "--wrap", "true"], check=False)
    assert r.returncode != 0 and "Invalid account" in r.stderr
    job = run(as_test + ["--wrap", "true"]).stdout.strip()
    assert wait_for_job(job, 60) == ("COMPLETED", "0:0")
    assert run(["sacct", "-X", "-n", "-P", "-j", job, "--format=Account,User"]).stdout.split() == ["acct_b|testuser"]


# ------------------------------------------------------------------ ssh

def _client(devcluster):
    c = paramiko.SSHClient()
    c.load_host_keys(devcluster["ssh"]["known_hosts"])
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    return c


def _key(devcluster):
    return paramiko.Ed25519Key.from_private_key_file(devcluster["ssh"]["identity_file"])


def _exec(client, cmd):
    _i, o, e = client.exec_command(cmd, timeout=60)
    out, err = o.read().decode(), e.read().decode()
    return o.channel.recv_exit_status(), out, err


def test_ssh_key_login_and_sbatch(devcluster):
    ssh = devcluster["ssh"]
    c = _client(devcluster)
    c.connect(ssh["host"], port=ssh["port_key"], username=ssh["user"], pkey=_key(devcluster),
              look_for_keys=False, allow_agent=False, timeout=20)
    try:
        rc, out, err = _exec(c, "sbatch --parsable -o /dev/null --wrap 'exit 3'")
        assert rc == 0, err
        job = out.strip().split(";")[0]
    finally:
        c.close()
    assert wait_for_job(job, 60) == ("FAILED", "3:0")


def test_ssh_unknown_host_key_is_rejected(devcluster, tmp_path):
    ssh = devcluster["ssh"]
    c = paramiko.SSHClient()
    (tmp_path / "empty_known_hosts").write_text("")
    c.load_host_keys(str(tmp_path / "empty_known_hosts"))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        c.connect(ssh["host"], port=ssh["port_key"], username=ssh["user"], pkey=_key(devcluster),
                  look_for_keys=False, allow_agent=False, timeout=20)


def test_ssh_otp_port_needs_key_and_code(devcluster):
    """Port 2223: the key alone is only a partial success; keyboard-interactive must follow."""
    ssh = devcluster["ssh"]
    sock = socket.create_connection((ssh["host"], ssh["port_otp"]), timeout=20)
    t = paramiko.Transport(sock)
    try:
        t.start_client(timeout=20)
        hk = paramiko.HostKeys(ssh["known_hosts"])
        assert hk.check(f"[{ssh['host']}]:{ssh['port_otp']}", t.get_remote_server_key())
        assert t.auth_publickey(ssh["user"], _key(devcluster)) == ["keyboard-interactive"]
        prompts = []

        def handler(title, instructions, fields):
            prompts.append([p for p, _echo in fields])
            return [ssh["otp_static"]] * len(fields)

        t.auth_interactive(ssh["user"], handler)
        assert t.is_authenticated()
        assert prompts[0] == ["Password: "]
    finally:
        t.close()


@pytest.mark.parametrize("kind", ["static", "totp"])
def test_ssh_otp_login(devcluster, kind):
    ssh = devcluster["ssh"]
    code = ssh["otp_static"] if kind == "static" else pyotp.TOTP(ssh["totp_secret"]).now()
    c = _client(devcluster)
    # paramiko answers the keyboard-interactive prompt with `password` (auth_password fallback)
    c.connect(ssh["host"], port=ssh["port_otp"], username=ssh["user"], pkey=_key(devcluster),
              password=code, look_for_keys=False, allow_agent=False, timeout=20)
    try:
        rc, out, _err = _exec(c, "echo otp-ok; sinfo -h -o %P")
        assert rc == 0 and out.split() == ["otp-ok", "batch*", "gb200"]
    finally:
        c.close()


def test_ssh_otp_wrong_code_refused(devcluster):
    ssh = devcluster["ssh"]
    good = {ssh["otp_static"]} | {pyotp.TOTP(ssh["totp_secret"]).at(time.time() + d) for d in (-30, 0, 30)}
    wrong = next(c for c in ("000000", "111111", "999999") if c not in good)
    c = _client(devcluster)
    with pytest.raises(paramiko.AuthenticationException):
        c.connect(ssh["host"], port=ssh["port_otp"], username=ssh["user"], pkey=_key(devcluster),
                  password=wrong, look_for_keys=False, allow_agent=False, timeout=20)
    c.close()
