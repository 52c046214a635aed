"""scrapy-redis 0.9.1's settings as the frontier reads them.

A project leaving scrapy-redis switches to the frontier by pointing
``SCHEDULER`` and ``DUPEFILTER_CLASS`` at ours and leaving its other
settings as they were. This module says what becomes of them
(``docs/scrapy-redis.md`` has the full table):

* scrapy-redis's component classes that have a frontier counterpart are
  taken as it: ``scrapy_redis.queue.PriorityQueue`` (its default
  ``SCHEDULER_QUEUE_CLASS``, also named ``SpiderPriorityQueue``) as
  :class:`~crawler.frontier.queue.LeasedPriorityQueue`, and
  ``scrapy_redis.dupefilter.RFPDupeFilter`` as
  :class:`~crawler.frontier.dupefilter.FrontierDupeFilter` (both keep a
  shared set of fingerprints at ``SCHEDULER_DUPEFILTER_KEY``).
* Settings the frontier cannot honour are refused (:func:`refusals`): one
  line each, reported at start as a configuration error, never a traceback.

No I/O here.
"""

from __future__ import annotations

import importlib
import logging
import pickle  # only to recognise pickle.loads in a serializer; never called
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: The scheduler's logger: what it takes a setting as is its to say.
logger = logging.getLogger("crawler.frontier.scheduler")

__all__ = [
    "DEFAULT_DUPEFILTER_KEY",
    "DEFAULT_QUEUE_CLASS",
    "OUR_SCHEDULER",
    "dupefilter_class",
    "dupefilter_key",
    "queue_class",
    "refusals",
    "scheduler_options",
    "uses_frontier_scheduler",
]

#: The frontier's queue, and what ``SCHEDULER_QUEUE_CLASS`` unset means here.
DEFAULT_QUEUE_CLASS = "crawler.frontier.queue.LeasedPriorityQueue"
#: The frontier's scheduler: the scrapy-redis settings matter only with it.
OUR_SCHEDULER = "crawler.frontier.scheduler.FrontierScheduler"
#: The frontier's dupefilter class.
DEFAULT_DUPEFILTER_CLASS = "crawler.frontier.dupefilter.FrontierDupeFilter"
#: ``SCHEDULER_DUPEFILTER_KEY`` unset (its hash tag keeps the set in the
#: frontier's Redis Cluster slot; scrapy-redis's default has none).
DEFAULT_DUPEFILTER_KEY = "{%(spider)s}:dupefilter"

#: scrapy-redis's priority queue, under both its names: served by priority,
#: as the frontier serves.
_SR_PRIORITY_QUEUES = frozenset(
    {"scrapy_redis.queue.PriorityQueue", "scrapy_redis.queue.SpiderPriorityQueue"}
)
#: scrapy-redis's queues that ignore priority: order the frontier cannot keep.
_SR_ORDER_QUEUES = {
    "scrapy_redis.queue.FifoQueue": "first in, first out",
    "scrapy_redis.queue.SpiderQueue": "first in, first out",
    "scrapy_redis.queue.LifoQueue": "last in, first out",
    "scrapy_redis.queue.SpiderStack": "last in, first out",
}
_SR_DUPEFILTER = "scrapy_redis.dupefilter.RFPDupeFilter"
#: ``SCHEDULER_QUEUE_KEY`` values accepted: unset, the project's, and
#: scrapy-redis's default. The frontier's keys are ``{<spider>}:...``
#: whatever it says (crawler/keys.py): a key of another name cannot be kept.
_QUEUE_KEYS = frozenset({"{%(spider)s}", "%(spider)s:requests"})
#: ``SCHEDULER_DUPEFILTER_KEY`` values accepted: the project's and
#: scrapy-redis's default, both meaning ``{<spider>}:dupefilter``, the set
#: the frontier's scripts record fingerprints in.
_DUPEFILTER_KEYS = frozenset({DEFAULT_DUPEFILTER_KEY, "%(spider)s:dupefilter"})


def _path(value: Any) -> str:
    """A class setting as a dotted path (a class object gives its own)."""
    if isinstance(value, str):
        return value
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}"


def queue_class(settings: BaseSettings) -> str:
    """The queue class path the scheduler uses for ``SCHEDULER_QUEUE_CLASS``:
    the frontier's when unset or scrapy-redis's priority queue, else the
    setting as given (:func:`refusals` checks it)."""
    value = settings.get("SCHEDULER_QUEUE_CLASS")
    if not value or _path(value) in _SR_PRIORITY_QUEUES:
        return DEFAULT_QUEUE_CLASS
    return _path(value)


def dupefilter_key(settings: BaseSettings) -> str:
    """The dupefilter's key template for ``SCHEDULER_DUPEFILTER_KEY``:
    :data:`DEFAULT_DUPEFILTER_KEY` when unset or one of the accepted values,
    else the setting as given (:func:`refusals` refuses it)."""
    value = settings.get("SCHEDULER_DUPEFILTER_KEY")
    if not value or value in _DUPEFILTER_KEYS:
        return DEFAULT_DUPEFILTER_KEY
    return str(value)


def dupefilter_class(settings: BaseSettings) -> str:
    """The dupefilter class path the scheduler uses for ``DUPEFILTER_CLASS``:
    the frontier's for scrapy-redis's ``RFPDupeFilter``, else the setting."""
    value = settings.get("DUPEFILTER_CLASS")
    if not value or _path(value) == _SR_DUPEFILTER:
        return DEFAULT_DUPEFILTER_CLASS
    return _path(value)


def _subclass_problem(name: str, path: str, base: str, what: str) -> str | None:
    try:
        cls = load_object(path)
    except (ImportError, NameError, ValueError, AttributeError):
        return None  # the settings table's own check names it
    if isinstance(cls, type) and issubclass(cls, load_object(base)):
        return None
    return f"{name}={path}: must be {base} or a subclass ({what})"


#: Serializer modules known to unpickle (scrapy-redis's default among them).
_PICKLE_MODULES = frozenset({"pickle", "_pickle", "cPickle", "dill", "cloudpickle",
                             "scrapy_redis.picklecompat"})


def unpickles(serializer: Any) -> bool:
    """Whether ``serializer`` (a module path, or a module or object with
    ``loads``) is pickle or a module known to unpickle. A path that cannot
    be imported is left to the setting's own check."""
    if isinstance(serializer, str):
        if serializer in _PICKLE_MODULES:
            return True
        try:
            serializer = importlib.import_module(serializer)
        except ImportError:
            return False
    loads = getattr(serializer, "loads", None)
    return getattr(serializer, "__name__", "") in _PICKLE_MODULES or loads is pickle.loads or (
        getattr(loads, "__module__", "") in _PICKLE_MODULES
    )


def uses_frontier_scheduler(settings: BaseSettings) -> bool:
    """Whether ``SCHEDULER`` is :data:`OUR_SCHEDULER` or a subclass (a
    path that cannot be imported is left to the setting's own check)."""
    value = settings.get("SCHEDULER")
    if not value:
        return False
    try:
        cls = load_object(value) if isinstance(value, str) else value
    except (ImportError, NameError, ValueError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, load_object(OUR_SCHEDULER))


def refusals(settings: BaseSettings) -> list[str]:
    """One line per scrapy-redis setting the frontier cannot honour.

    Only with the frontier's scheduler (``SCHEDULER`` names
    :data:`OUR_SCHEDULER` or a subclass): settings that schedule with
    Scrapy's own scheduler (no add-on applied yet, say) get none, since
    Scrapy's ``DUPEFILTER_CLASS`` default is right for it. The scheduler
    reports these at start, as does :func:`crawler.checks.validate_settings`.
    """
    if not uses_frontier_scheduler(settings):
        return []
    out = []
    raw_queue = settings.get("SCHEDULER_QUEUE_CLASS")
    if raw_queue and _path(raw_queue) in _SR_ORDER_QUEUES:
        path = _path(raw_queue)
        out.append(
            f"SCHEDULER_QUEUE_CLASS={path}: not supported (the frontier serves requests "
            f"by priority, first in, first out among equals, and cannot keep "
            f"{_SR_ORDER_QUEUES[path]} order across priorities; remove the setting, "
            "and use DEPTH_PRIORITY for breadth- or depth-first order)"
        )
    elif (problem := _subclass_problem(
        "SCHEDULER_QUEUE_CLASS", queue_class(settings), DEFAULT_QUEUE_CLASS,
        "the frontier's leases and politeness live in it")) is not None:
        out.append(problem)
    if (problem := _subclass_problem(
        "DUPEFILTER_CLASS", dupefilter_class(settings), DEFAULT_DUPEFILTER_CLASS,
        "the frontier records fingerprints in its shared set")) is not None:
        out.append(problem)
    key = settings.get("SCHEDULER_QUEUE_KEY")
    if key and key not in _QUEUE_KEYS:
        out.append(
            f"SCHEDULER_QUEUE_KEY={key}: not supported (the frontier keeps its keys "
            "under {<spider>}:, see crawler/keys.py; remove the setting)"
        )
    key = settings.get("SCHEDULER_DUPEFILTER_KEY")
    if key and key not in _DUPEFILTER_KEYS:
        out.append(
            f"SCHEDULER_DUPEFILTER_KEY={key}: not supported (the frontier records "
            "fingerprints in {<spider>}:dupefilter; remove the setting)"
        )
    if settings.getbool("REDIS_START_URLS_AS_ZSET") and not settings.getbool(
        "REDIS_START_URLS_AS_SET"
    ):
        out.append(
            "REDIS_START_URLS_AS_ZSET=True: not supported (seeds are read from a list "
            "or, with REDIS_START_URLS_AS_SET, a set; give a seed's priority in its "
            'JSON: {"url": ..., "priority": 9})'
        )
    serializer = settings.get("SCHEDULER_SERIALIZER")
    if serializer and unpickles(serializer):
        out.append(
            f"SCHEDULER_SERIALIZER={_path(serializer)}: not supported (it unpickles what it "
            "reads from Redis, so anyone who can write to that Redis could run code on every "
            "worker; remove the setting: the frontier's tagged JSON keeps datetimes, bytes, "
            "sets and items, docs/requests.md)"
        )
    if settings.getbool("REDIS_DECODE_RESPONSES"):
        out.append("REDIS_DECODE_RESPONSES=True: not supported (the frontier reads bytes)")
    return out


def scheduler_options(settings: BaseSettings) -> tuple[dict[str, Any], str, list[str]]:
    """What the frontier's scheduler takes from scrapy-redis's settings.

    :returns: the keywords of :class:`scrapy_redis.scheduler.Scheduler`
        that come from settings (``persist``, ``flush_on_start``,
        ``queue_key`` when set, ``queue_cls``, and ``serializer`` when
        ``SCHEDULER_SERIALIZER`` is set: a module, imported), the
        dupefilter's class path, and the settings refused
        (:func:`refusals`; then the frontier's own classes are used, and
        the refusal is reported when the scheduler opens). A setting taken
        as the frontier's class is logged at INFO.
    """
    kwargs: dict[str, Any] = {
        "persist": settings.getbool("SCHEDULER_PERSIST"),
        "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
    }
    if value := settings.get("SCHEDULER_QUEUE_KEY"):
        kwargs["queue_key"] = value
    refused = refusals(settings)
    if refused:
        kwargs["queue_cls"] = DEFAULT_QUEUE_CLASS
        dupefilter_path = DEFAULT_DUPEFILTER_CLASS
    else:
        kwargs["queue_cls"] = queue_class(settings)
        dupefilter_path = dupefilter_class(settings)
        for setting, path in (
            ("SCHEDULER_QUEUE_CLASS", kwargs["queue_cls"]),
            ("DUPEFILTER_CLASS", dupefilter_path),
        ):
            given = settings.get(setting)
            if given and given != path:
                logger.info("%s=%s: taken as %s", setting, given, path)
    serializer = settings.get("SCHEDULER_SERIALIZER")
    if isinstance(serializer, str):
        serializer = importlib.import_module(serializer)
    if serializer:
        kwargs["serializer"] = serializer
    return kwargs, dupefilter_path, refused
