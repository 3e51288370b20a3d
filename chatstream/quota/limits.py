"""The limits that apply to a user: their override, else their groups' most generous, else the
site default (``CHATSTREAM_DEFAULT_QUOTA``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.checks import CheckMessage, Error
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models

from ..conf import conf
from ..models import MONEY_MAXIMUMS, QUOTA_MAXIMUMS, GroupQuota, UserQuota
from .ledger import db_for
from .pricing import amount

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

# CHATSTREAM_DEFAULT_QUOTA key -> Limits attribute.
SETTING_KEYS: dict[str, str] = {name.upper(): name for name in QUOTA_MAXIMUMS | MONEY_MAXIMUMS
                                } | {"MODELS": "models"}


@dataclass(frozen=True)
class Limits:
    """One user's effective limits; None means unlimited (or, for ``models``, every model)."""

    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    requests_per_minute: int | None = None
    concurrent_streams: int | None = None
    max_prompt_tokens: int | None = None
    models: frozenset[str] | None = None
    cost_per_day: Decimal | None = None  # in CHATSTREAM_CURRENCY
    cost_per_month: Decimal | None = None

    @property
    def spends(self) -> bool:
        """Whether a money limit applies."""
        return self.cost_per_day is not None or self.cost_per_month is not None

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, name) is None for name in SETTING_KEYS.values())


def default_limits() -> Limits:
    """The site-wide default from ``CHATSTREAM_DEFAULT_QUOTA`` (unset keys: unlimited)."""
    errors = setting_errors()
    if errors:  # fail closed: a typo must never become "unlimited"
        raise ImproperlyConfigured(f"{errors[0].msg} {errors[0].hint}")
    raw: Mapping[str, Any] = conf.DEFAULT_QUOTA or {}
    values = {SETTING_KEYS[key]: value for key, value in raw.items()}
    if values.get("models") is not None:
        values["models"] = frozenset(values["models"])
    for name in MONEY_MAXIMUMS:
        if values.get(name) is not None:
            values[name] = amount(values[name])
    return Limits(**values)


QUOTA_NUMBERS = {name.upper(): name for name in QUOTA_MAXIMUMS}
MONEY_KEYS = {name.upper(): name for name in MONEY_MAXIMUMS}
QUOTA_HINT = ('For example CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 50000, '
              '"REQUESTS_PER_MINUTE": 20, "CONCURRENT_STREAMS": 2, "COST_PER_MONTH": "20.00"}; '
              'None means unlimited.')


def setting_errors() -> list[CheckMessage]:
    """What is wrong with CHATSTREAM_DEFAULT_QUOTA (the quotas refuse to run with it); the
    system checks report the same."""
    value = conf.DEFAULT_QUOTA
    if value is None:
        value = {}
    if not isinstance(value, dict):
        return [Error(f"CHATSTREAM_DEFAULT_QUOTA must be a dict, not {value!r}.",
                      hint=QUOTA_HINT, id="chatstream.E020")]
    errors: list[CheckMessage] = []
    for key, limit in value.items():
        if key in QUOTA_NUMBERS:
            maximum = QUOTA_MAXIMUMS[QUOTA_NUMBERS[key]]
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum
            ):
                errors.append(Error(
                    f"CHATSTREAM_DEFAULT_QUOTA[{key!r}] must be None (unlimited) or a whole "
                    f"number from 1 to {maximum}, not {limit!r}.",
                    hint="Zero, negative, fractional, NaN and infinite limits are refused: "
                    "use None for no limit.",
                    id="chatstream.E022",
                ))
        elif key in MONEY_KEYS:
            errors += _check_money_limit(key, limit)
        elif key == "MODELS":
            errors += _check_quota_models(limit)
        else:
            known = ", ".join([*QUOTA_NUMBERS, *MONEY_KEYS, "MODELS"])
            errors.append(Error(
                f"CHATSTREAM_DEFAULT_QUOTA has an unknown key {key!r}.",
                hint=f"Known keys: {known}. A misspelt key would silently mean 'unlimited'.",
                id="chatstream.E021",
            ))
    return errors


def _check_money_limit(key: str, limit: object) -> list[CheckMessage]:
    if limit is None:
        return []
    maximum = MONEY_MAXIMUMS[MONEY_KEYS[key]]
    try:
        if 0 < amount(limit) <= maximum:
            return []
    except ValueError:
        pass
    return [Error(
        f"CHATSTREAM_DEFAULT_QUOTA[{key!r}] must be None (unlimited) or an amount above 0 up to "
        f"{maximum}, written as a decimal string, not {limit!r}.",
        hint='For example "20.00", in CHATSTREAM_CURRENCY; floats are refused, as in PRICE: '
        "use None for no limit.",
        id="chatstream.E022",
    )]


def _check_quota_models(value: object) -> list[CheckMessage]:
    if value is None:
        return []
    if (not isinstance(value, list | tuple) or not value
            or not all(isinstance(key, str) for key in value)):
        return [Error(
            f"CHATSTREAM_DEFAULT_QUOTA['MODELS'] must be None (every model) or a non-empty "
            f"list of model keys, not {value!r}.",
            hint="For example ['mini']; groups or users can be granted more in the admin.",
            id="chatstream.E023",
        )]
    models = conf.MODELS if isinstance(conf.MODELS, dict) else {}
    unknown = [key for key in value if key not in models]
    if unknown:
        return [Error(
            f"CHATSTREAM_DEFAULT_QUOTA['MODELS'] names {unknown!r}, not in CHATSTREAM_MODELS.",
            hint=f"Use keys of CHATSTREAM_MODELS: {sorted(models)!r}.",
            id="chatstream.E024",
        )]
    return []


class _Inherit:
    """The type of :data:`_INHERIT`: an override that leaves a limit to the next level."""


_INHERIT = _Inherit()

# One limit's value: a number, an amount, a set of model keys, or None (unlimited / every model).
_Value = int | Decimal | frozenset[str] | None


def _explicit(override: UserQuota | GroupQuota, name: str) -> _Value | _Inherit:
    """The override's own value for ``name``: a number, None (explicitly unlimited), or inherit."""
    if name == "models":
        if override.all_models:
            return None
        keys = override.model_keys()
        return _INHERIT if keys is None else frozenset(keys)
    if getattr(override, f"unlimited_{name}"):
        return None
    value: int | Decimal | None = getattr(override, name)
    return _INHERIT if value is None else value


def resolve(default: Limits, user_quota: UserQuota | None,
            group_quotas: Iterable[GroupQuota]) -> Limits:
    """Each limit from the user's override, else their groups' most generous, else the default."""
    groups = list(group_quotas)
    values: dict[str, Any] = {}
    for name in SETTING_KEYS.values():
        own = _explicit(user_quota, name) if user_quota is not None else _INHERIT
        if not isinstance(own, _Inherit):
            values[name] = own
            continue
        given = [v for v in (_explicit(g, name) for g in groups) if not isinstance(v, _Inherit)]
        if not given:
            values[name] = getattr(default, name)
        elif any(v is None for v in given):
            values[name] = None  # one group without a limit: the most generous
        elif name == "models":
            values[name] = frozenset[str]().union(*(v for v in given if isinstance(v, frozenset)))
        else:
            values[name] = max(v for v in given if isinstance(v, int | Decimal))
    return Limits(**values)


def load_limits(user_ids: list[Any], db: str) -> dict[Any, Limits]:
    """Limits of the users ``user_ids``, keyed by primary key, in three queries."""
    default = default_limits()
    own = {q.user_id: q for q in UserQuota.objects.using(db).filter(user_id__in=user_ids)}
    groups: dict[Any, list[GroupQuota]] = {pk: [] for pk in user_ids}
    members: dict[Any, list[Any]] = {}
    for user_id, group_id in _memberships(user_ids, db):
        members.setdefault(group_id, []).append(user_id)
    if members:
        for quota in GroupQuota.objects.using(db).filter(group_id__in=members):
            for user_id in members[quota.group_id]:
                groups[user_id].append(quota)
    return {pk: resolve(default, own.get(pk), groups[pk]) for pk in user_ids}


def _memberships(user_ids: list[Any], db: str) -> list[tuple[Any, Any]]:
    """(user id, group id) pairs, read from the user model's ``groups`` table if it has one."""
    found = _membership_table()
    if found is None:
        return []
    through, user_key, group_key = found
    return list(through._default_manager.using(db).filter(**{f"{user_key}__in": user_ids})
                .values_list(user_key, group_key))


def _membership_table() -> tuple[type[models.Model], str, str] | None:
    """The user model's ``groups`` table and its user and group columns' names, if it has
    Django's memberships."""
    try:
        groups = get_user_model()._meta.get_field("groups")
    except FieldDoesNotExist:  # a custom user model without PermissionsMixin
        return None
    if not isinstance(groups, models.ManyToManyField):
        return None  # a "groups" field of another kind: not Django's memberships
    through = groups.remote_field.through
    assert through is not None  # set for every many-to-many once the models are loaded
    # The through model's two foreign keys, read as their raw ids: no join.
    return through, groups.m2m_field_name(), groups.m2m_reverse_field_name()


def overrides_of(user: Any) -> models.QuerySet[Any]:
    """The overrides that apply to the user ``user`` (an id, or a slot for one), in one
    statement: their own and their groups', each row an override's columns in field order and
    then whether it is a group's."""
    own = UserQuota.objects.filter(user_id=user).annotate(cs_group=models.Value(False))
    found = _membership_table()
    if found is None:
        return own
    through, user_key, group_key = found
    groups = through._default_manager.filter(**{user_key: user}).values(group_key)
    return own.union(GroupQuota.objects.filter(group_id__in=groups)
                     .annotate(cs_group=models.Value(True)), all=True)


def limits_for(user: AbstractBaseUser, *, using: str | None = None) -> Limits:
    """``user``'s effective limits (override > most generous group > site default)."""
    return load_limits([user.pk], using or db_for(user))[user.pk]


def limits_for_many(users: Iterable[AbstractBaseUser], *,
                    using: str | None = None) -> dict[Any, Limits]:
    """Limits of several users, keyed by primary key, in three queries (for the admin)."""
    users = list(users)
    if not users:
        return {}
    return load_limits([u.pk for u in users], using or db_for(users[0]))
