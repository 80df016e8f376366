"""The leaf types: what a step, a call and the loop return (timing.py) and the fault a test injects
(fault.py). Standard library only; they import nothing of the trainer but errors.py, so every folder
can use them without an arrow pointing back up (STYLE.md 21)."""
