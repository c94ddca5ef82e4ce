"""config/claims.yaml: its schema, reading and validation (amprepro.analysis.claims evaluates the claims it returns)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jsonschema
import yaml

from amprepro import precisions
from amprepro.analysis.claimmetrics import HIGHER_IS_BETTER
from amprepro.schemaerrors import bounded_message, field_name, first_error

_NUMBER = {"type": "number"}
_MODEL_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}
_MARGIN = {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5,
           "description": "the relative final held-out loss gap (0.01 = 1 %) the paired bounds are judged against"}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "description": "config/claims.yaml: the claims the report evaluates (docs/report.md describes every field)",
    "type": "object",
    "additionalProperties": False,
    "required": ["claims"],
    "properties": {
        "claims": {"type": "array", "items": {"$ref": "#/$defs/claim"}},
    },
    "$defs": {
        "precision": {"enum": []},  # precisions.names(), filled in by schema()
        "claim": {
            "type": "object",
            "additionalProperties": False,
            "required": ["id", "source", "statement", "model", "models", "claimed", "tolerance"],
            # A python_speedup claim compares interpreters, not precisions: its runs are in a committed evidence file
            # (amprepro.analysis.pythonclaim) and it has no baseline or variant precision; a claim about the environment
            # (judge:, amprepro.analysis.envclaims) has no single variant precision; every other claim has all three.
            "if": {"properties": {"metric": {"const": "python_speedup"}}, "required": ["metric"]},
            "then": {"required": ["evidence"]},
            "else": {"if": {"not": {"required": ["judge"]}}, "then": {"required": ["metric", "baseline", "variant"]}},
            "properties": {
                "id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_.-]*$",
                       "description": "unique, lower-case letters, digits, '-', '_', '.'"},
                "source": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["file", "title"],
                    "properties": {
                        "file": {"type": "string", "minLength": 1, "description": "the article (seed file name)"},
                        "title": {"type": "string", "minLength": 1},
                        "quote": {"type": "string", "description": "the sentence that makes the claim, verbatim"},
                        "url": {"type": "string"},
                    },
                },
                "statement": {"type": "string", "minLength": 1, "description": "the claim, in one English sentence"},
                "model": {"type": "string", "minLength": 1, "description": "the model as the article names it"},
                "models": {
                    "type": "array", "minItems": 1, "uniqueItems": True,
                    "items": {"type": "string", "pattern": "^[A-Za-z0-9_]+$"},
                    "description": ("cell models (config names or archs) that stand for it; [any] = every model; "
                                    "[benchmark] = every model on synthetic data"),
                },
                "metric": {"enum": list(HIGHER_IS_BETTER)},
                "baseline": {
                    "oneOf": [{"$ref": "#/$defs/precision"},
                              {"type": "array", "minItems": 1, "uniqueItems": True,
                               "items": {"$ref": "#/$defs/precision"}}],
                },
                "variant": {"$ref": "#/$defs/precision"},
                "claimed": {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": False,
                    "properties": {
                        "about": _NUMBER, "at_least": _NUMBER, "at_most": _NUMBER,
                        "between": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2},
                    },
                },
                "tolerance": {"type": "number", "minimum": 0,
                              "description": "in the metric's units: x for speedup, a fraction for memory_reduction"},
                "requires": {"type": "array", "uniqueItems": True, "items": {"enum": ["tensor_cores"]}},
                "not_measurable": {"type": "string", "minLength": 1,
                                   "description": "why no run of this pipeline can test the claim as stated"},
                "proxy": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["models", "note"],
                    "properties": {
                        "models": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                        "note": {"type": "string"},
                    },
                },
                "convergence": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["models", "margin"],
                    "description": ("models whose final held-out loss judges an accuracy claim where its own "
                                    "models cannot: the paired gap against FP32 over seeds against margin "
                                    "(amprepro.analysis.convergence)"),
                    "properties": {
                        "models": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                        "margin": _MARGIN,
                        "note": {"type": "string"},
                    },
                },
                "stability": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["models", "margin", "verdict_words"],
                    "description": ("an apex opt level's stability on real text over seeds: collapses, non-finite "
                                    "steps and the paired held-out loss gap against margin "
                                    "(amprepro.analysis.optlevels)"),
                    "properties": {
                        "models": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                        "margin": _MARGIN,
                        "verdict_words": {
                            "type": "object", "additionalProperties": False, "required": ["holds", "falls_short"],
                            "properties": {"holds": {"type": "string", "minLength": 1},
                                           "falls_short": {"type": "string", "minLength": 1}},
                        },
                        "note": {"type": "string"},
                    },
                },
                "risk": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "maxProperties": 1,
                    "description": ("an AMP risk point (models: the risky models, each precision judged against its "
                                    "FP32 cells) or its remedies (remedies: a remedy model against the risky model "
                                    "it changes): amprepro.analysis.riskclaims"),
                    "properties": {
                        "models": {"type": "array", "minItems": 1, "uniqueItems": True, "items": _MODEL_NAME},
                        "remedies": {
                            "type": "array", "minItems": 1,
                            "items": {"type": "object", "additionalProperties": False,
                                      "required": ["risky", "remedy", "setting"],
                                      "properties": {"risky": _MODEL_NAME, "remedy": _MODEL_NAME,
                                                     "setting": {"type": "string", "minLength": 1}}},
                        },
                    },
                },
                "lora": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["memory_gib"],
                    "description": ("metric lora_parameters: the card memory the claim is about and the setting its "
                                    "prediction is made at (amprepro.analysis.loraclaim)"),
                    "properties": {
                        "memory_gib": {"type": "number", "exclusiveMinimum": 0},
                        "batch": {"type": "integer", "minimum": 1},
                        "seq_len": {"type": "integer", "minimum": 2},
                        "rank": {"type": "integer", "minimum": 1},
                        "checkpointing": {"type": "boolean"},
                    },
                },
                "judge": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["kind"],
                    "description": ("a claim about the environment, judged from pairs of cells by "
                                    "amprepro.analysis.envclaims: apex_shell (the shell's cells against strict FP32 "
                                    "and TF32 and the full build), environment (the largest memory and speed gaps "
                                    "between cells that differ only in environment settings; memory: its band)"),
                    "properties": {
                        "kind": {"enum": ["apex_shell", "environment"]},
                        "memory": {"$ref": "#/$defs/claim/properties/claimed"},
                        "memory_tolerance": {"type": "number", "minimum": 0},
                    },
                },
                "evidence": {"type": "string", "pattern": "^results-reference/python/[A-Za-z0-9_.-]+\\.json$",
                             "description": ("python_speedup only: the committed evidence file, relative to the "
                                             "repository (tools/python_speed/ makes it)")},
                "note": {"type": "string"},
                "caveats": {"type": "array", "items": {"type": "string", "minLength": 1},
                            "description": "what a reader must know to read the verdict; the report lists them"},
            },
        },
    },
}


# What a python_speedup claim has no use for: each is about a precision, or the run's cells.
PRECISION_FIELDS = ("baseline", "variant", "requires", "proxy", "convergence", "not_measurable")


def schema() -> dict:
    """SCHEMA with the precision enum read from the registry."""
    return {**SCHEMA, "$defs": {**SCHEMA["$defs"], "precision": {"enum": precisions.names()}}}


class ClaimsError(ValueError):
    """config/claims.yaml is wrong; the message names the claim and the field."""



def _claim_id_label(claims: list) -> Callable[[list], str]:
    """Labels claims[i] with its id, so that the message names the claim as the file's reader knows it."""
    def label(path: list) -> str:
        if len(path) == 2 and path[0] == "claims" and isinstance(path[1], int) and path[1] < len(claims):
            claim_id = claims[path[1]].get("id") if isinstance(claims[path[1]], dict) else None
            return f" (id {claim_id!r})" if claim_id else ""
        return ""
    return label


def validate(data, where: str = "config/claims.yaml") -> list[dict]:
    """Validate parsed claims.yaml; return the claims with `baseline` normalised to a list."""
    if not isinstance(data, dict):
        raise ClaimsError(f"{where}: expected a mapping with a `claims:` list, got {type(data).__name__}.")
    claims = data.get("claims") if isinstance(data.get("claims"), list) else []
    validator = jsonschema.Draft202012Validator(schema())
    error = first_error(validator, data)
    if error is not None:
        raise ClaimsError(f"{where}: claim field {field_name(error, label=_claim_id_label(claims))}: "
                          f"{bounded_message(error)}. Fix that field (docs/report.md lists the claim fields).")
    seen = {}
    for index, claim in enumerate(claims):
        field = f"claims[{index}] (id {claim['id']!r})"
        if claim["id"] in seen:
            raise ClaimsError(f"{where}: claim field {field}.id: duplicate id, "
                              f"also used by claims[{seen[claim['id']]}].")
        seen[claim["id"]] = index
        between = claim["claimed"].get("between")
        if between and between[0] > between[1]:
            raise ClaimsError(f"{where}: claim field {field}.claimed.between: {between} is not [low, high].")
        if claim.get("metric") == "python_speedup":  # judged from its evidence file: no precisions (the schema's if)
            extra = next((key for key in PRECISION_FIELDS if key in claim), None)
            if extra:
                raise ClaimsError(f"{where}: claim field {field}.{extra}: a python_speedup claim is judged from its "
                                  "evidence file (interpreters, not precisions, are compared); remove the field.")
            continue
        if "evidence" in claim:
            raise ClaimsError(f"{where}: claim field {field}.evidence: only a python_speedup claim reads an evidence "
                              f"file, this one is {claim.get('metric')}; remove the field.")
        baseline = claim.get("baseline", [])
        claim["baseline"] = [baseline] if isinstance(baseline, str) else list(baseline)
        judge = claim.get("judge", {}).get("kind")
        if judge == "environment" and "memory" not in claim["judge"]:
            raise ClaimsError(f"{where}: claim field {field}.judge.memory: an environment claim needs its memory "
                              "band (e.g. {at_least: 0.40}) beside the speed band in claimed.")
        if judge == "apex_shell" and (claim.get("metric") != "speedup" or not claim["baseline"]):
            raise ClaimsError(f"{where}: claim field {field}.judge: an apex_shell claim is a speedup against its "
                              "baselines. Fix: set metric: speedup and baseline: [fp32, tf32].")
        if claim.get("variant") in claim["baseline"]:
            raise ClaimsError(f"{where}: claim field {field}.variant: {claim['variant']!r} is also a baseline.")
        if claim.get("convergence") and (claim["metric"] != "accuracy_delta" or claim["claimed"] != {"at_least": 0}
                                         or claim["baseline"] != ["fp32"]):
            raise ClaimsError(f"{where}: claim field {field}.convergence: held-out losses judge only an "
                              "accuracy_delta claim of the form claimed {at_least: 0} against baseline fp32 (\"not "
                              "lower than FP32\"). Fix: remove convergence or write the claim that way.")
        if claim.get("risk"):
            check_risk(claim, f"{where}: claim field {field}")
        if claim.get("stability") and (claim["metric"] != "accuracy_delta" or claim["baseline"] != ["fp32"]
                                       or not precisions.get(claim["variant"]).needs_apex
                                       or claim.get("convergence")):
            raise ClaimsError(f"{where}: claim field {field}.stability: stability judges only an apex opt level "
                              "(variant apex_o1/apex_o2/apex_o3) against baseline fp32 in an accuracy_delta claim "
                              "without convergence. Fix: remove stability or write the claim that way.")
        if (claim.get("metric") == "lora_parameters") != bool(claim.get("lora")) or (
                claim.get("lora") and ("at_least" not in claim["claimed"] or claim["variant"] != "amp_bf16")):
            raise ClaimsError(f"{where}: claim field {field}.lora: the metric lora_parameters and the lora field go "
                              "together, with claimed {at_least: parameters} and variant amp_bf16 (the bf16 base "
                              "under AMP; amprepro.analysis.loraclaim). Fix: write both, or neither.")
    return claims


def check_risk(claim: dict, where: str) -> None:
    """A risk claim (amprepro.analysis.riskclaims) compares final held-out losses with FP32's: metric heldout_loss_gap,
    baseline fp32, and its margin as claimed at_least (a risk: harm beyond it) or at_most (a remedy: no harm beyond
    it)."""
    wanted = "at_least" if "models" in claim["risk"] else "at_most"
    if claim["metric"] != "heldout_loss_gap" or claim["baseline"] != ["fp32"] or wanted not in claim["claimed"]:
        raise ClaimsError(f"{where}.risk: a {'risk' if wanted == 'at_least' else 'remedy'} claim is judged on the "
                          f"final held-out loss against FP32. Fix: write metric: heldout_loss_gap, baseline: [fp32] "
                          f"and claimed: {{{wanted}: <margin in nats>}}.")


def load_claims(path: str | Path) -> list[dict]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ClaimsError(f"{path}: no claims file. Fix: restore it from the repository.") from None
    except yaml.YAMLError as exc:
        raise ClaimsError(f"{path}: not valid YAML: {exc}") from None
    return validate(data, str(path))
