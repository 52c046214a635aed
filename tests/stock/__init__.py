"""A stock scrapy-redis project, run beside ours for side-by-side figures."""
