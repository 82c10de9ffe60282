"""Learned models of a plant for people: fit from logs, predict, roll out, save, load."""

from neorl_industrial.wrappers.models.plant_model import (
    FitSettings,
    OutsideDataWarning,
    PlantModel,
    PlantModelError,
    dataset_fingerprint,
)

__all__ = [
    "FitSettings",
    "OutsideDataWarning",
    "PlantModel",
    "PlantModelError",
    "dataset_fingerprint",
]
