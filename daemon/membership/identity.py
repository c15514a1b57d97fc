"""The member keypair and the host fingerprint (DESIGN §2), as files under the data dir.

The fingerprint catches an accidental clone of the data dir onto another machine; it is not
an attacker-grade control. ``accept-host`` rewrites it and keeps the keypair.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from tidemesh.daemon.process.private import write_atomically

_VIRTUAL_IF = re.compile(
    r"^(lo|docker|br-|veth|tap|tun|tailscale|wg|utun|ppp|vboxnet|vmnet|awdl|llw|virbr|cni|flannel)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Keypair:
    signing_key: SigningKey

    @property
    def public_hex(self) -> str:
        return bytes(self.signing_key.verify_key).hex()


def write_private(path: Path, data: dict[str, object]) -> None:
    """Write a 0600 JSON file atomically (temp file, fsync, rename)."""
    write_atomically(path, json.dumps(data, indent=2).encode("utf-8"))


def load_or_create_keypair(path: Path) -> tuple[Keypair, bool]:
    """Return the member keypair, creating it on first use; the bool says it was created."""
    if path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
        return Keypair(SigningKey(bytes.fromhex(data["ed25519_seed"]))), False
    key = SigningKey.generate()
    save_keypair(path, key)
    return Keypair(key), True


def save_keypair(path: Path, key: SigningKey) -> None:
    write_private(path, {
        "version": 1,
        "ed25519_seed": bytes(key).hex(),
        "ed25519_public": bytes(key.verify_key).hex(),
    })


@dataclass(frozen=True, slots=True)
class EphemeralKey:
    """An ephemeral member's key: made by ``daemon join``, claimed by the daemon that runs
    with it. One still claimed when a daemon starts was left by a daemon that was killed."""

    keypair: Keypair
    claimed_by: int | None    # the pid of the daemon that took it


def save_ephemeral(path: Path, key: SigningKey, claimed_by: int | None = None) -> None:
    write_private(path, {
        "version": 1,
        "ed25519_seed": bytes(key).hex(),
        "ed25519_public": bytes(key.verify_key).hex(),
        "claimed_by": claimed_by,
    })


def load_ephemeral(path: Path) -> EphemeralKey | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return EphemeralKey(Keypair(SigningKey(bytes.fromhex(data["ed25519_seed"]))),
                        data.get("claimed_by"))


def _machine_id() -> str:
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            value = Path(candidate).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if value:
            return value
    if platform.system() == "Darwin":
        out = subprocess.run(
            ["ioreg", "-rd1", "-c", "IOPlatformExpertDevice"],
            capture_output=True, text=True, check=False, timeout=5,
        ).stdout
        m = re.search(r'"IOPlatformUUID" = "([^"]+)"', out)
        if m:
            return m.group(1)
    return ""


def _first_stable_mac() -> str:
    net = Path("/sys/class/net")
    if not net.is_dir():
        return ""
    for iface in sorted(p.name for p in net.iterdir()):
        if _VIRTUAL_IF.match(iface) or (net / iface).resolve().parent.name == "virtual":
            continue
        try:
            mac = (net / iface / "address").read_text(encoding="ascii").strip().lower()
        except OSError:
            continue
        if mac and mac != "00:00:00:00:00:00":
            return mac
    return ""


# Replaces machine-id and MAC as what the fingerprint hashes: for containers whose machine-id
# is not stable, and for tests that play two hosts on one machine.
HOST_ID_ENV = "TIDEMESH_HOST_ID"


def current_host_fingerprint(environ: Mapping[str, str] = os.environ) -> str:
    """sha256(machine_id || first_stable_mac), hex (or of ``TIDEMESH_HOST_ID`` when set)."""
    host_id = environ.get(HOST_ID_ENV) or (_machine_id() + _first_stable_mac())
    return hashlib.sha256(host_id.encode()).hexdigest()


def folder_mark(folder: Path) -> str:
    """The data folder's own identity (device and inode): the same for the folder a daemon
    always ran in, different for a copy of it (``cp -a``, rsync) on the same host, which
    carries the same machine id, MAC and files."""
    st = os.stat(folder)
    return f"{st.st_dev}:{st.st_ino}"


def host_problem(path: Path, current: str) -> str | None:
    """Why this data folder may not start here, or None: ``host_fingerprint_mismatch`` (made
    on another host) or ``data_folder_copied`` (a copy of a folder on this host). Writes
    the record on first use; a record from before the folder was part of it gains it."""
    folder = folder_mark(path.parent)
    if not path.exists():
        accept_host(path, current)
        return None
    stored = json.loads(path.read_text(encoding="utf-8"))
    if stored.get("fingerprint") != current:
        return "host_fingerprint_mismatch"
    if stored.get("folder") is None:
        accept_host(path, current)
        return None
    return None if stored["folder"] == folder else "data_folder_copied"


def check_host(path: Path, current: str) -> bool:
    """True when this folder may start here (``host_problem`` finds nothing)."""
    return host_problem(path, current) is None


def accept_host(path: Path, current: str) -> None:
    """Adopt this host and this folder: after a move, a hardware change or a restore."""
    write_private(path, {"version": 1, "fingerprint": current,
                         "folder": folder_mark(path.parent)})


def instance_mark(current: str, data_dir: Path) -> str:
    """What the hello's host mark hashes: the host and the folder, so that a copy adopted
    with ``accept-host`` while its original runs is still told apart by the broker."""
    return hashlib.sha256(f"{current}|{folder_mark(data_dir)}".encode()).hexdigest()
