"""The NVIDIA driver's own kernel-log lines for an ended IMEX daemon, what it does after each, and who resumes.

The one place for these facts (design.md source imex-abrupt-shutdown): ``imexctl health`` decides by
them, its fix line and the docs say them (tests/commands/test_health.py holds the docs to them).

When ``nvidia-imex`` ends, the driver destroys its IMEX session
(open-gpu-kernel-modules ``src/nvidia/src/kernel/compute/imex_session_api.c``,
``imexsessionapiDestruct_IMPL``) and may log two lines:

- :data:`DISABLED`, when the daemon's client still held exports (it crashed or
  was killed): the driver refuses fabric allocations on the tray from then on.
  It allows them again as soon as an ``nvidia-imex`` starts a new session
  (``imexsessionapiConstruct_IMPL``; the next job's prolog starts one), and
  leaves *when* to start one to an admin ("admin controlled" in the source):
  memory released early may still be mapped by importers on other trays.  A
  fault of the tray (``imex_shutdown``): drained until an admin resumes it.
- :data:`RECOVERY`, when processes on this tray still held memory imported
  through the daemon: the driver reset and disabled their channels.  That is
  what happens to a job's stragglers when its epilog stops the daemon, no
  fault of the tray: a note, never a drain.

Each is ``NV_PRINTF(LEVEL_ERROR, ...)``: the format ``"NVRM: " sentence``,
whose ``NVRM`` ``nvDbg_Printf`` replaces with the prefix ``RmMsgPrefix``
writes, by default (``nvDbgRmMsgCheck``) ``NVRM: ``, ``GPU<n>`` when a GPU is
current, the function's name (after a blank when the GPU is there); then
``: `` and the sentence.  ``nv_printf`` hands it to ``vprintk`` (``KERN_CONT``,
no level): a record of the kernel's own facility.  Drivers 570.86.15 to
570.144 and 575.51.02 to 575.51.03 end the sentences with ``!``; drivers
before 570 print neither (their lines are ``LEVEL_WARNING``, which release
builds do not print).  An ``NVreg_RmMsg`` that changes the prefix (a debug
setting) makes other shapes, which are not matched.
"""

from __future__ import annotations

from typing import Final

from imexctl.platform.kmsg import KERNEL

__all__ = ["AFTER_DISABLED", "AFTER_RECOVERY", "DISABLED", "FUNCTION", "RECOVERY", "RESUME", "sentence_of"]

#: the line when the daemon's session ended with exports left: fabric allocations are refused (a fault)
DISABLED: Final = "Abrupt nvidia-imex daemon shutdown detected, disabled fabric allocations"
#: the line when the driver stopped the processes that held memory imported through the daemon (no fault)
RECOVERY: Final = "Abrupt nvidia-imex daemon shutdown detected, robust channel recovery invoked"
#: the function that prints both, named in the record's prefix
FUNCTION: Final = "imexsessionapiDestruct_IMPL"
#: what the driver does after :data:`DISABLED`
AFTER_DISABLED: Final = "the driver refuses fabric allocations on this tray until the next nvidia-imex starts"
#: what the driver did before :data:`RECOVERY`
AFTER_RECOVERY: Final = (
    "the driver stopped the processes here that still held memory imported through the daemon (a job's stragglers)"
)
#: who puts a tray back in service after :data:`DISABLED`, and when
RESUME: Final = "an admin resumes the tray once the job that lost its daemon has ended on every tray of its domain"

_NVRM: Final = "NVRM: "
_FUNCTION_END: Final = f"{FUNCTION}: "


def sentence_of(facility: int, message: str) -> str:
    """:data:`DISABLED` or :data:`RECOVERY` when the record is the driver's own line for it, else ''.

    The record counts only with the kernel's facility and with exactly the
    shape the driver prints, from its start to its end:
    ``NVRM: [GPU<n> ]imexsessionapiDestruct_IMPL: <sentence>[!]``.  A
    record that only quotes the sentence (a mount option in ``tmpfs:
    Unknown parameter '...'``, a command name) or that user space wrote is
    not the driver's.
    """
    if facility != KERNEL or not message.startswith(_NVRM):
        return ""
    rest = message[len(_NVRM) :]
    if rest.startswith("GPU"):  # "GPU%u" and a blank: the GPU current when it printed
        number, blank, rest = rest[len("GPU") :].partition(" ")
        if not blank or not (number.isascii() and number.isdigit()) or number != str(int(number)):
            return ""
    if not rest.startswith(_FUNCTION_END):
        return ""
    sentence = rest[len(_FUNCTION_END) :]
    sentence = sentence.removesuffix("!")
    return sentence if sentence in (DISABLED, RECOVERY) else ""
