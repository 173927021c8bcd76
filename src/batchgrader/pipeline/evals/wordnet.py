"""WordNet for METEOR, offline.

nltk's METEOR needs WordNet 3.0, which nltk fetches with ``nltk.download`` (from a site that is
not a package registry, so not here).  It is found, in order:

1. nltk's own data path (``NLTK_DATA``, ``~/nltk_data``, ...) holding ``corpora/wordnet``;
2. the directory named by ``BATCHGRADER_WORDNET_DIR``, or Debian's ``wordnet-base`` package
   (``/usr/share/wordnet``; ``apt-get install wordnet-base``), copied once into
   ``<cache>/nltk_data/corpora/wordnet`` (nltk refuses to read corpora outside its data path),
   with the ``lexnames`` file nltk needs and Debian leaves out, written from the list in
   WordNet's ``lexnames(5WN)`` manual page.

With neither, :func:`wordnet` raises :class:`WordNetMissing`, saying how to install it: the
meteor metric is refused rather than computed without synonyms.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

ENV_DIR = "BATCHGRADER_WORDNET_DIR"
DEBIAN_DIR = Path("/usr/share/wordnet")
# WordNet 3.0's lexicographer files (lexnames(5WN)): number, name, syntactic category
LEXNAMES = (
    "adj.all 3", "adj.pert 3", "adv.all 4", "noun.Tops 1", "noun.act 1", "noun.animal 1", "noun.artifact 1",
    "noun.attribute 1", "noun.body 1", "noun.cognition 1", "noun.communication 1", "noun.event 1", "noun.feeling 1",
    "noun.food 1", "noun.group 1", "noun.location 1", "noun.motive 1", "noun.object 1", "noun.person 1",
    "noun.phenomenon 1", "noun.plant 1", "noun.possession 1", "noun.process 1", "noun.quantity 1", "noun.relation 1",
    "noun.shape 1", "noun.state 1", "noun.substance 1", "noun.time 1", "verb.body 2", "verb.change 2",
    "verb.cognition 2", "verb.communication 2", "verb.competition 2", "verb.consumption 2", "verb.contact 2",
    "verb.creation 2", "verb.emotion 2", "verb.motion 2", "verb.perception 2", "verb.possession 2", "verb.social 2",
    "verb.stative 2", "verb.weather 2", "adj.ppl 3",
)  # fmt: skip
_NEEDED = ("index.noun", "data.noun", "index.verb", "data.verb", "index.adj", "data.adj", "index.adv", "data.adv")
HOW_TO_GET = (
    "METEOR needs WordNet 3.0 offline: `apt-get install wordnet-base` (Debian/Ubuntu), or "
    "`python -m nltk.downloader -d ~/nltk_data wordnet` where that site is reachable, or set "
    f"{ENV_DIR} to a folder holding WordNet's dict files (index.noun, data.noun, ...)"
)


class WordNetMissing(RuntimeError):
    pass


def default_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("batchgrader", appauthor=False)) / "nltk_data"


def _source_dir() -> Path | None:
    for d in (os.environ.get(ENV_DIR), DEBIAN_DIR):
        if d and all((Path(d) / f).is_file() for f in _NEEDED):
            return Path(d)
    return None


def install(cache: Path) -> Path:
    """Copy the WordNet files found into ``cache/corpora/wordnet`` (once; atomically), with
    ``lexnames``; the nltk data folder ``cache``."""
    target = cache / "corpora" / "wordnet"
    if (target / "lexnames").is_file():
        return cache
    src = _source_dir()
    if src is None:
        raise WordNetMissing(HOW_TO_GET)
    tmp = target.with_name(f".wordnet-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("."):
            shutil.copyfile(f, tmp / f.name)
    if not (tmp / "lexnames").exists():
        (tmp / "lexnames").write_text("".join(f"{i:02d}\t{n.split()[0]}\t{n.split()[1]}\n" for i, n in enumerate(LEXNAMES)))
    try:
        os.rename(tmp, target)
    except OSError:  # another process put it there first
        shutil.rmtree(tmp, ignore_errors=True)
    return cache


@functools.lru_cache(maxsize=1)
def wordnet(cache: str | None = None) -> Any:
    """nltk's WordNet reader, loaded and checked (:class:`WordNetMissing` with the fix)."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    try:
        root = nltk.data.find("corpora/wordnet")
    except LookupError:
        folder = install(Path(cache) if cache else default_cache())
        if str(folder) not in nltk.data.path:
            nltk.data.path.append(str(folder))
        root = nltk.data.find("corpora/wordnet")
    import warnings

    with warnings.catch_warnings():  # "multilingual functions are not available": METEOR uses none
        warnings.simplefilter("ignore", UserWarning)
        reader = WordNetCorpusReader(root, None)
    if not reader.synsets("dog"):
        raise WordNetMissing("the WordNet found has no synsets for 'dog': it is incomplete. " + HOW_TO_GET)
    return reader
