"""The certificates that make the stack's own Docker engine reachable by root only.

An engine API is root on the machine (a container can mount ``/``), so ``lab stack engine up``
listens on TCP with mutual TLS (``--tlsverify``, Docker's documented way to protect its socket):
dockerd accepts only a client presenting a certificate signed by the stack's own CA. That client
certificate and its key live in ``<stack_dir>/secrets/engine`` (directory 0700, keys 0600, owned by
root, who runs the engine): a process of another uid cannot read them, neither can a participant
host (a namespace on the same bridge). The CA's key signs the two certificates and is deleted at
once, so nobody can make another one. A firewall rule matching the uid would leave the bridge's
other hosts able to connect, and a unix socket would keep the API calls off the network, which the
engine is there to put them on.

The files follow ``DOCKER_CERT_PATH``'s names: ``ca.pem``, ``cert.pem``, ``key.pem`` (the
client's), and ``server-cert.pem``, ``server-key.pem`` (dockerd's, whose certificate names the
engine's address). They are made by ``openssl`` with a umask of 077, so no key is ever readable by
others, and made again when they are missing or name another address.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

from lab.stack.base import StackError

DAYS = "3650"
OPENSSL_TIMEOUT_S = 60.0
FILES = ("ca.pem", "cert.pem", "key.pem", "server-cert.pem", "server-key.pem")
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def complete(tls_dir: Path, address: str) -> bool:
    """Whether ``tls_dir`` holds every file, made for ``address``."""
    try:
        return all((tls_dir / f).is_file() for f in FILES) and (tls_dir / "address").read_text().strip() == address
    except OSError:
        return False


def _openssl(tls_dir: Path, *args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise StackError("the lab's own engine needs the openssl command for its TLS certificates "
                         "(Debian: apt-get install openssl)")
    try:
        done = subprocess.run([exe, *args], cwd=tls_dir, capture_output=True, text=True, umask=0o077,
                              timeout=OPENSSL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StackError(f"openssl {args[0]} took over {OPENSSL_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise StackError(f"openssl {args[0]} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def _sign(tls_dir: Path, name: str, subject: str, extensions: str) -> None:
    """``<name>.pem``-style key and certificate signed by the CA: ``key`` and ``cert`` files."""
    key, cert = ("key.pem", "cert.pem") if name == "client" else (f"{name}-key.pem", f"{name}-cert.pem")
    (tls_dir / f"{name}.ext").write_text(extensions)
    _openssl(tls_dir, "req", "-new", *_KEY, "-keyout", key, "-out", f"{name}.csr", "-subj", subject)
    _openssl(tls_dir, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
             "-set_serial", str(secrets.randbits(63)), "-days", DAYS, "-out", cert, "-extfile", f"{name}.ext")


def ensure(tls_dir: Path, address: str) -> Path:
    """The engine's CA, server and client certificates in ``tls_dir`` (made unless :func:`complete`);
    returns ``tls_dir``. Its parent must be the stack's claimed secrets dir."""
    if complete(tls_dir, address):
        return tls_dir
    shutil.rmtree(tls_dir, ignore_errors=True)
    tls_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tls_dir.mkdir(mode=0o700)
    try:
        _openssl(tls_dir, "req", "-x509", *_KEY, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", DAYS,
                 "-subj", "/CN=fanout-lab engine CA", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        leaf = "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\n"
        _sign(tls_dir, "server", f"/CN={address}",
              leaf + f"subjectAltName = IP:{address}\nextendedKeyUsage = serverAuth\n")
        _sign(tls_dir, "client", "/CN=fanout-lab root", leaf + "extendedKeyUsage = clientAuth\n")
    finally:  # the CA's key signs these two and nothing else
        for leftover in ("ca-key.pem", "server.csr", "client.csr", "server.ext", "client.ext"):
            (tls_dir / leftover).unlink(missing_ok=True)
    (tls_dir / "address").write_text(address + "\n")
    return tls_dir
