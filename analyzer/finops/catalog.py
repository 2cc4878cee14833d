"""The price catalog: $ per GPU-hour by GPU model, MIG slices by their share, per-cluster overrides.

File format (YAML; ``fixtures/prices/default.yaml`` is the documented default)::

    currency: USD                 # ISO 4217 code, FOCUS BillingCurrency
    models:                       # first match wins, in file order: put specific names first
      - key: H100                 # short SKU name (FOCUS SkuId), unique
        match: 'H100'             # case-insensitive regex searched in the model name of the data
        price_per_gpu_hour: 3.00  # one whole physical GPU for one hour
        mig_shares: {1g.10gb: 0.125}   # optional: price share of a MIG profile (default N/7)
    billing_account: {id: acme-gpu, name: ACME GPU platform}   # optional: FOCUS BillingAccountId/Name
    clusters:                     # optional per-cluster overrides (``--cluster NAME``)
      onprem-a:
        models:
          - {key: H100, price_per_gpu_hour: 1.90}              # re-prices the default entry
          - {key: H20, match: 'H20\\b', price_per_gpu_hour: 1.1} # new entries match before the defaults

Model names come from the data as NVML/DCGM report them ("NVIDIA H100 80GB HBM3",
"NVIDIA A100-SXM4-80GB", "NVIDIA L40S"); a regex ``search`` keeps the key robust to the
"NVIDIA " prefix and form-factor suffixes. A model no entry matches is *unpriced*: the
cost report counts its GPU-hours in an ``unpriced`` bucket and names the model, it never
prices it at $0 (write ``price_per_gpu_hour: 0`` to say a GPU really is free).

MIG: a MIG instance is priced at ``share`` x the GPU's price per hour, ``share`` being the
profile's entry in ``mig_shares`` or else the frame's ``gpu_share`` (N/7 for an ``Ng`` profile).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The documented default catalog (illustrative list prices: override them with your own).
DEFAULT_CATALOG_PATH = Path(__file__).resolve().parents[2] / "fixtures" / "prices" / "default.yaml"
_TOP_KEYS = {"currency", "models", "clusters", "source", "description", "billing_account"}
#: FOCUS BillingAccountId when the catalog names none (internal chargeback of one's own GPUs).
DEFAULT_BILLING_ACCOUNT = "truegpu"
_MODEL_KEYS = {"key", "match", "price_per_gpu_hour", "mig_shares", "note"}
_CURRENCY = re.compile(r"^[A-Z]{3}$")


class CatalogError(ValueError):
    """A price catalog that cannot be used (bad file, bad value, unknown cluster)."""


@dataclass(frozen=True)
class ModelPrice:
    key: str
    match: str
    price_per_gpu_hour: float
    mig_shares: Mapping[str, float] = field(default_factory=dict)

    def matches(self, model: str) -> bool:
        return re.search(self.match, model, re.IGNORECASE) is not None

    def share(self, mig_profile: str | None, gpu_share: float) -> float:
        """Share of the GPU price a device pays: the profile's ``mig_shares`` entry or ``gpu_share``."""
        if mig_profile and mig_profile in self.mig_shares:
            return float(self.mig_shares[mig_profile])
        return float(gpu_share)


@dataclass
class Catalog:
    currency: str
    models: list[ModelPrice]
    #: Which cluster's overrides are applied (None: the defaults).
    cluster: str | None = None
    source: str = ""
    #: FOCUS BillingAccountId / BillingAccountName (``billing_account: {id, name}`` in the file).
    billing_account_id: str = DEFAULT_BILLING_ACCOUNT
    billing_account_name: str = ""

    def lookup(self, model: str | None) -> ModelPrice | None:
        """The first entry matching ``model``; None when unpriced (never a silent $0)."""
        if not model:
            return None
        return next((m for m in self.models if m.matches(str(model))), None)

    def price(self, model: str | None) -> float | None:
        entry = self.lookup(model)
        return None if entry is None else entry.price_per_gpu_hour

    def to_json(self) -> dict[str, Any]:
        return {
            "currency": self.currency, "cluster": self.cluster, "source": self.source,
            "billing_account": {"id": self.billing_account_id, "name": self.billing_account_name},
            "models": [{"key": m.key, "match": m.match, "price_per_gpu_hour": m.price_per_gpu_hour,
                        **({"mig_shares": dict(m.mig_shares)} if m.mig_shares else {})} for m in self.models],
        }


def _where(origin: str, ctx: str) -> str:
    return f"{origin}: {ctx}" if ctx else origin


def _model(raw: Any, origin: str, ctx: str, base: ModelPrice | None = None) -> ModelPrice:
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{_where(origin, ctx)}: each model entry must be a mapping, got {raw!r}")
    unknown = set(raw) - _MODEL_KEYS
    if unknown:
        raise CatalogError(f"{_where(origin, ctx)}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                           f"(allowed: {', '.join(sorted(_MODEL_KEYS))})")
    key = raw.get("key")
    if not isinstance(key, str) or not key.strip():
        raise CatalogError(f"{_where(origin, ctx)}: model entry needs a non-empty 'key'")
    ctx = f"{ctx} model {key!r}".strip()
    match = raw.get("match", base.match if base else None)
    if not isinstance(match, str) or not match:
        raise CatalogError(f"{_where(origin, ctx)}: needs 'match' (a regex searched in the GPU model name)")
    try:
        re.compile(match)
    except re.error as exc:
        raise CatalogError(f"{_where(origin, ctx)}: bad regex {match!r}: {exc}") from None
    if "price_per_gpu_hour" not in raw and base is None:
        raise CatalogError(f"{_where(origin, ctx)}: needs 'price_per_gpu_hour'")
    price = raw.get("price_per_gpu_hour", base.price_per_gpu_hour if base else None)
    if isinstance(price, bool) or not isinstance(price, int | float) or not price >= 0 or price == float("inf"):
        raise CatalogError(f"{_where(origin, ctx)}: price_per_gpu_hour must be a number >= 0, got {price!r}")
    shares = raw.get("mig_shares", base.mig_shares if base else {}) or {}
    if not isinstance(shares, Mapping):
        raise CatalogError(f"{_where(origin, ctx)}: mig_shares must map MIG profile -> share")
    for prof, s in shares.items():
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= 1:
            raise CatalogError(f"{_where(origin, ctx)}: mig_shares[{prof!r}] must be in (0, 1], got {s!r}")
    return ModelPrice(key.strip(), match, float(price), {str(k): float(v) for k, v in shares.items()})


def _models(raw: Any, origin: str, ctx: str) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise CatalogError(f"{_where(origin, ctx)}: 'models' must be a non-empty list")
    return raw


def parse_catalog(data: Any, *, cluster: str | None = None, origin: str = "price catalog") -> Catalog:
    """Validate a parsed catalog document and apply ``cluster``'s overrides."""
    if not isinstance(data, Mapping):
        raise CatalogError(f"{origin}: expected a mapping with 'currency' and 'models'")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise CatalogError(f"{origin}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                           f"(allowed: {', '.join(sorted(_TOP_KEYS))})")
    currency = data.get("currency", "USD")
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        raise CatalogError(f"{origin}: currency must be an ISO 4217 code like USD, got {currency!r}")
    models = [_model(m, origin, "") for m in _models(data.get("models"), origin, "")]
    keys = [m.key for m in models]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise CatalogError(f"{origin}: duplicate model key(s) {', '.join(dup)}")
    clusters = data.get("clusters") or {}
    if not isinstance(clusters, Mapping):
        raise CatalogError(f"{origin}: 'clusters' must map a cluster name to its overrides")
    if cluster is not None:
        if cluster not in clusters:
            known = ", ".join(sorted(map(str, clusters))) or "none"
            raise CatalogError(f"{origin}: no cluster {cluster!r} in the catalog (clusters: {known})")
        over = clusters[cluster] or {}
        if not isinstance(over, Mapping) or set(over) - {"models"}:
            raise CatalogError(f"{origin}: cluster {cluster!r}: expected a mapping with 'models'")
        by_key = {m.key: i for i, m in enumerate(models)}
        new: list[ModelPrice] = []
        for raw in _models(over.get("models"), origin, f"cluster {cluster!r}"):
            base_i = by_key.get(raw.get("key")) if isinstance(raw, Mapping) else None
            entry = _model(raw, origin, f"cluster {cluster!r}", models[base_i] if base_i is not None else None)
            if base_i is not None:
                models[base_i] = entry
            else:
                new.append(entry)
        models = new + models  # a cluster's own models match before the defaults
    source = data.get("source", "")
    account = data.get("billing_account") or {}
    if not isinstance(account, Mapping) or set(account) - {"id", "name"} or not all(
            isinstance(v, str) and v for v in account.values()):
        raise CatalogError(f"{origin}: billing_account must be a mapping with non-empty string 'id' and 'name'")
    return Catalog(currency, models, cluster, str(source or origin),
                   billing_account_id=account.get("id", DEFAULT_BILLING_ACCOUNT),
                   billing_account_name=account.get("name", ""))


def load_catalog(path: str | Path | None = None, *, cluster: str | None = None) -> Catalog:
    """Load and validate a catalog file (default: the documented ``fixtures/prices/default.yaml``)."""
    from analyzer.yamlfile import read_yaml

    path = Path(path) if path is not None else DEFAULT_CATALOG_PATH
    data = read_yaml(path, "price catalog", CatalogError)
    cat = parse_catalog(data, cluster=cluster, origin=str(path))
    if not data.get("source"):
        cat.source = str(path)
    return cat


def default_catalog(cluster: str | None = None) -> Catalog:
    return load_catalog(None, cluster=cluster)
