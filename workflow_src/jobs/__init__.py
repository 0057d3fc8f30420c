"""What every family's plan (speedup/plan.py, bitwise/plan.py, randopt/plan.py, targets.py) builds its jobs
from, as plain functions of the validated config:

- `sections`: the config section files jobs read, and the checkpoint's inputs;
- `external`: an external subject's two sides (their commands, code records and worktrees);
- `rl`: how the RL subject is launched (one rank or the ranks CLI) behind its reward service.
"""
