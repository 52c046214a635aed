"""Storage: what the crawl needs of the place its items are stored.

An item store is an item pipeline that

* **stores items durably**: :meth:`ItemStore.process_item` returns once the
  item is stored (a worker acknowledges a response's lease only after its
  items are), and storing an item twice (a response delivered twice)
  leaves one copy: an item without a natural key is stored under the id
  derived from the response that yielded it (:func:`derive_item_id`,
  handed over through :class:`ItemIds`);
* **records each item's source** with revisits on
  (``FRONTIER_REVISIT_AFTER`` > 0): the fingerprint of the request whose
  response yielded it (:class:`ItemSources`), so that
* **a 304 touches** what that page yielded: :meth:`ItemStore.touch` raises
  their ``last_seen`` when a revisit finds the page not modified.

:class:`crawler.pipelines.MongoPipeline` is one; ``tests/test_storage.py``
has a JSON-lines file store that is another. A store registers itself for
its crawler (:func:`register_store`); the revisit middleware finds it with
:func:`store_of` and imports no pipeline (``.importlinter``).

Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable
from weakref import WeakKeyDictionary

from scrapy import signals

if TYPE_CHECKING:
    from datetime import datetime

    from scrapy.crawler import Crawler

__all__ = [
    "ADDED_STAT_PREFIX",
    "SOURCE_FIELD",
    "ItemIds",
    "ItemSources",
    "ItemStore",
    "collection_of",
    "derive_item_id",
    "register_store",
    "store_of",
]


@runtime_checkable
class ItemStore(Protocol):
    """An item pipeline that stores items durably and touches them on a 304.

    Besides :meth:`process_item` and :meth:`touch`, a store has two
    attributes (class attributes will do): :attr:`name` and :attr:`errors`.
    """

    @property
    def name(self) -> str:
        """What the store is, for messages (``"MongoDB"``)."""
        ...

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions :meth:`touch` raises when the store failed
        (nothing or part was written; touching again is harmless): the
        revisit is then a dead letter, sent again by ``scrapy deadletters
        requeue``. Any other exception is a bug and propagates."""
        ...

    async def process_item(self, item: Any) -> Any:
        """Store ``item``; return it once it is stored durably.

        An item without a natural key (``key`` attribute) is stored under
        the id :class:`ItemIds` holds for it, when any, so that a second
        delivery of its response stores it once; with revisits on, the
        source :class:`ItemSources` holds for it is recorded with it
        (:data:`SOURCE_FIELD`).
        """
        ...

    def touch(self, source: str, when: datetime) -> int:
        """Record that the response of request ``source`` is unchanged at
        ``when``: the items it yielded get ``last_seen`` (and their fetch
        times) raised to ``when``, never lowered. Blocking: called in a
        thread.

        :param source: the request's fingerprint, hex (as :class:`ItemSources` holds it).
        :param when: an aware UTC datetime.
        :returns: the items changed.
        :raises Exception: one of :attr:`errors` when the store failed.
        """
        ...


_stores: WeakKeyDictionary[Crawler, ItemStore] = WeakKeyDictionary()


def register_store(crawler: Crawler, store: ItemStore) -> None:
    """Make ``store`` the item store of ``crawler`` (:func:`store_of`);
    a store calls it when it is built. The last one registered wins."""
    _stores[crawler] = store


def store_of(crawler: Crawler) -> ItemStore | None:
    """The item store registered for ``crawler``, or None (items go to
    feeds only: a 304 then has nothing to touch)."""
    return _stores.get(crawler)


#: The field of a stored document that holds the fingerprint (hex) of the
#: request whose response last yielded it, with revisits on
#: (``FRONTIER_REVISIT_AFTER`` > 0): a 304 to that request's revisit raises
#: those documents' ``last_seen`` (:meth:`ItemStore.touch`).
SOURCE_FIELD = "_src"
#: Prefix of the per-collection counts of documents an item store added
#: (created, not updated): ``mongo/added/<collection>``; summed over the
#: workers in ``{<spider>}:stats``, they tell which documents each spider
#: stored (:mod:`crawler.status`).
ADDED_STAT_PREFIX = "mongo/added/"


def collection_of(item: Any, spider_name: str) -> str:
    """The collection ``item`` is stored in: its class's ``collection``
    attribute, else the spider's name."""
    return getattr(item, "collection", None) or spider_name


def derive_item_id(
    spider: str, fingerprint: bytes, collection: str, item_class: str, ordinal: int
) -> str:
    """The ``_id`` of an item without a natural key, the same at every delivery.

    :param spider: the spider's name.
    :param fingerprint: Scrapy's request fingerprint of the request whose
        response yielded the item (``crawler.request_fingerprinter``, 20 bytes).
    :param collection: the item's collection (:func:`collection_of`).
    :param item_class: the item's class, ``module.QualName`` (``builtins.dict``).
    :param ordinal: the item's rank among the items of its collection and
        class (that need an id) which that response's callback yielded,
        from 0.
    :returns: 32 lowercase hex digits (128 bits of SHA-256 over the above):
        a string, not an ObjectId, so that it never passes for a time.
    """
    digest = hashlib.sha256()
    for part in (spider.encode(), fingerprint, collection.encode(), item_class.encode()):
        digest.update(len(part).to_bytes(4, "big") + part)
    digest.update(ordinal.to_bytes(8, "big"))
    return digest.hexdigest()[:32]


class ItemIds:
    """Ids derived for items without a natural key, from the spider
    middleware to the pipeline.

    :class:`~crawler.middlewares.ItemIdMiddleware` sees each item with the
    response that yielded it, and :meth:`put` s the id it derives;
    the item store (:class:`ItemStore`) :meth:`pop` s it when the item reaches it. The
    item itself is left as it is (no undeclared field is added to an Item
    or a dataclass, no ``_id`` key to a dict, so feed exports do not change).

    Ids are held by the identity of the item (``id(item)``), with a
    reference to the item, so an id can never go to another object that
    happens to get the same address. Entries leave when the pipeline takes
    them, or when the item is dropped or fails in an earlier pipeline
    (``item_dropped``, ``item_error`` signals); an item that a later spider
    middleware swallows leaves its entry behind, so at most ``capacity``
    entries are kept, the oldest forgotten first (:meth:`put` says how
    many). An item whose id was forgotten, or that an earlier pipeline
    replaced with a new object, reaches the pipeline without an id and gets
    a fresh ObjectId (stat ``mongo/ids/minted``): a redelivery would then
    store it again.

    One instance per crawler: :meth:`of`.
    """

    #: Default most entries kept (items between the middleware and the pipeline).
    CAPACITY: ClassVar[int] = 100_000
    _by_crawler: ClassVar[WeakKeyDictionary[Crawler, ItemIds]] = WeakKeyDictionary()

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[int, tuple[Any, str]] = OrderedDict()

    @classmethod
    def of(cls, crawler: Crawler) -> ItemIds:
        """The crawler's instance, made (and hooked to its signals) on first use."""
        ids = cls._by_crawler.get(crawler)
        if ids is None:
            ids = cls._by_crawler[crawler] = cls()
            crawler.signals.connect(ids.discard, signal=signals.item_dropped)
            crawler.signals.connect(ids.discard, signal=signals.item_error)
        return ids

    def __len__(self) -> int:
        return len(self._ids)

    def put(self, item: Any, ident: str) -> int:
        """Hold ``ident`` for ``item``; return how many old entries were forgotten."""
        self._ids[id(item)] = (item, ident)
        self._ids.move_to_end(id(item))
        forgotten = 0
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
            forgotten += 1
        return forgotten

    def pop(self, item: Any) -> str | None:
        """The id held for ``item`` (and forget it), or None."""
        entry = self._ids.get(id(item))
        if entry is None or entry[0] is not item:
            return None
        del self._ids[id(item)]
        return entry[1]

    def discard(self, item: Any, **_: Any) -> None:
        """Forget ``item``'s id (a signal handler: the item went no further)."""
        self.pop(item)


class ItemSources(ItemIds):
    """Fingerprints (hex) of the requests whose responses yielded items,
    from :class:`~crawler.middlewares.ItemIdMiddleware` to the item store,
    which stores each in its document's :data:`SOURCE_FIELD` (revisits on).
    Held as :class:`ItemIds` holds ids; one instance per crawler: :meth:`of`.
    """

    _by_crawler: ClassVar[WeakKeyDictionary[Crawler, ItemIds]] = WeakKeyDictionary()
