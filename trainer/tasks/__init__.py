"""The built-in tasks and the task protocol: spec.py is the registry (`TaskSpec`, `register`, `get`),
task.py builds a `Task` from a built-in name or your `package.module:function`, and every other module
here is one built-in task that registers its spec on import (mlp.py, cnn.py)."""
