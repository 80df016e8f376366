"""Synchronous multi-worker TensorFlow training that measures where every step's time goes.

Importing the package selects tf-keras (Keras 2) for tf.keras unless the caller chose otherwise:
Keras 3 cannot train under MultiWorkerMirroredStrategy (keras-team/keras#20585, "unsupported type
PerReplica") and TensorFlow reads TF_USE_LEGACY_KERAS only when it is first imported, which every
module of this package that needs it does after this line has run.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"
