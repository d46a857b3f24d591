"""`gpulayer image list`: the OCI images a worker on this host has unpacked in its artifact cache."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from gpulayer.cli.common import fmt_time, print_json, print_table

image_app = typer.Typer(help="OCI images cached by the worker on this host (gpulayer submit --image).",
                        no_args_is_help=True)


@image_app.command("list")
def image_list(
    cache: Annotated[Optional[Path], typer.Option("--cache", help="The worker's artifact cache (default "
                                                  "$GPULAYER_ARTIFACT_CACHE, else "
                                                  "gpulayer-artifacts in the temp folder).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the images in a worker's cache here: digest, name, size, last used. `--image NAME` runs one.

    \b
    Examples:
      gpulayer image list
      GPULAYER_ARTIFACT_CACHE=/var/cache/gpulayer gpulayer image list --json
    """
    from agent.artifacts.cache import default_cache_dir
    from agent.sandbox.images import list_images
    images = list_images(cache or default_cache_dir())
    if as_json:
        print_json(images)
        return
    print_table([[image["digest"][:19], image["ref"] or "-", f"{image['bytes'] / 1e6:.1f} MB",
                  fmt_time(image["last_used"])] for image in images], ["DIGEST", "NAME", "SIZE", "LAST USED"])
