"""Project commands (``COMMANDS_MODULE``): ``scrapy seed``, ``scrapy frontier``."""
