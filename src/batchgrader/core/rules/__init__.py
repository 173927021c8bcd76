"""The pure rules: what to do next (`decide`), when (`due`), how a job ends, budgets, settling, stragglers, routes, panels, evals chains and schedules: functions of (state, config, now)."""
