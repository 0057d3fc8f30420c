"""HTTP reward service for the built-in RL subject.

`app.create_app` is a plain WSGI app (JSON only) that grades completions with the same grader as
`workflow_src.subjects.rl.rewards.InProcessRewards`; `service.RewardService` runs it under gunicorn on
loopback; `client.RewardClient` calls it with bounded retries and the same submit/resolve/score/close
interface as the in-process grader. A failure is an exception, never a silent zero.
"""
