"""The pyfunc policy model's code, logged with the model (MLflow's "models from code").

MLflow runs this file when it loads the model; the class lives in :mod:`.pyfunc`, so a
loaded model needs ``neorl_industrial`` installed (no pickled objects travel with it).
"""

import mlflow

from neorl_industrial.integration.mlflow.pyfunc import ShieldedPolicyModel

mlflow.models.set_model(ShieldedPolicyModel())
