"""A folder of the agent's own (the artifact cache): made 0700, or checked before it is used.

The default artifact cache is ``gpulayer-artifacts`` in the temp folder, which every local user may write:
one who made that folder first swapped a cached bundle, and the next job (another user's, with its secrets)
ran that script. So the folder must be the agent's user's, a folder and not a link, written by no one else,
under folders that only root or that user may change (a sticky one, as ``/tmp``, is fine: no one else may
rename what is in it). A folder that fails is refused at start with what is wrong and what to do.
"""

import os
import pwd
import stat
from pathlib import Path

from ..errors import AgentError
from ..events import log_event


class NotPrivate(AgentError):
    """A folder the agent must own alone is another user's, or may be written by others."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def private_folder(path: str | os.PathLike, what: str, variable: str) -> Path:
    """``path`` made (0700) or found as a folder of this user's that no one else may write (group or other
    read access, as an older agent left it, is taken away); its absolute path.

    Raises NotPrivate (exit 2) naming the problem and ``variable``, the setting that chooses another folder.
    """
    folder = Path(path).expanduser().absolute()
    me = os.geteuid()
    fix = f"remove it, or set {variable} to a folder of the agent's own"
    folder.parent.mkdir(parents=True, exist_ok=True)
    for above in [Path(os.path.realpath(folder.parent)), *Path(os.path.realpath(folder.parent)).parents]:
        st = os.stat(above)
        if st.st_uid not in (0, me):
            raise NotPrivate(f"{what} {folder} lies in {above}, which belongs to {_owner(st.st_uid)}: "
                             f"that user may replace the cache; {fix}")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise NotPrivate(f"{what} {folder} lies in {above}, which others may write to "
                             f"(mode {stat.S_IMODE(st.st_mode):04o}, not sticky): they may replace the cache; {fix}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"{what} {folder} is not a folder but {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'a file'}; {fix}")
    if st.st_uid != me:
        raise NotPrivate(f"{what} {folder} belongs to {_owner(st.st_uid)}, not to this agent's user "
                         f"{_owner(me)}: that user may have made it first to swap what jobs run; {fix}")
    if st.st_mode & 0o022:
        raise NotPrivate(f"{what} {folder} may be written by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                         f"what is in it cannot be trusted; {fix}")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
        log_event("private_folder_tightened", path=str(folder), mode=f"{stat.S_IMODE(st.st_mode):04o}")
    return folder
