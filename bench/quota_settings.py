"""The project's settings with a default quota that every JSON API answer reads (requests per
minute, tokens per day and per month), to measure the rate-limit headers' read where limits
apply: ``bench_start.py --env DJANGO_SETTINGS_MODULE=bench.quota_settings``."""

from project.settings import *  # noqa: F403

CHATSTREAM_DEFAULT_QUOTA = {"REQUESTS_PER_MINUTE": 100_000, "TOKENS_PER_DAY": 1_000_000_000,
                            "TOKENS_PER_MONTH": 1_000_000_000}
