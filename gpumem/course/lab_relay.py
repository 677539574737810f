"""What a lab's grading process prints, relayed to the learner as it comes, except its verdict.

The fresh process (:mod:`.lab_fresh`) prints progress, then the check's summary. Its summary may be
voided afterwards (graded code changed a library: :func:`.lab_intact.changed`), so the summary and
what follows it are held back until the parent has the rows: a voided check shows only why it does
not count (review r22 of lab 05 saw "all correct — well done." above "not graded").
"""

import codecs
import os
import re
import sys

VOID = "\x1e(void)"       # printed by the fresh process: its summary above this does not count


def relay(proc, lab: str) -> str:
    """Copy the process's output to this one's as it comes (tqdm's carriage returns included), up to
    the check's summary (a line ``lab: k/n checks pass``): that and what follows are returned, held
    until the verdict is known (review r22 of lab 05: "all correct" printed above "not graded")."""
    fd, out, text, shown, found = proc.stdout.fileno(), sys.stdout, "", 0, None
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    head = re.compile(rf"(^|[\n\r]){re.escape(lab)}: \d+/\d+ checks pass")     # \r: after tqdm's last bar
    while not found and (chunk := os.read(fd, 4096)):
        text += decode(chunk)
        if found := head.search(text, max(0, shown - 1)):
            end = found.start() + len(found.group(1))
        else:                                   # a last line that may yet become the summary waits
            cut = max(text.rfind("\n"), text.rfind("\r")) + 1
            end = cut if f"{lab}:".startswith(text[cut:cut + len(lab) + 1]) else len(text)
        out.write(text[shown:max(end, shown)])
        out.flush()
        shown = max(end, shown)
    while chunk := os.read(fd, 4096):
        text += decode(chunk)
    return text[shown:] + decode(b"", final=True)
