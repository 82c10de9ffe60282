"""Learned models of a plant for people: fit from logs, predict, roll out, save, load."""

from neorl_industrial.wrappers.models.model_data import FitSettings, dataset_fingerprint
from neorl_industrial.wrappers.models.model_files import PlantModelError
from neorl_industrial.wrappers.models.outside_data import OutsideDataWarning
from neorl_industrial.wrappers.models.plant_model import PlantModel

__all__ = [
    "FitSettings",
    "OutsideDataWarning",
    "PlantModel",
    "PlantModelError",
    "dataset_fingerprint",
]
