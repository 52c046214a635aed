"""A scrapy-redis 0.9.1 project switched to the frontier its way: SCHEDULER
and DUPEFILTER_CLASS pointed at ours, its other settings as they were."""
