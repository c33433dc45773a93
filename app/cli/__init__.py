"""The operator commands of `python -m app`: jobs, outbox, leader, prune.

The jobs, leader and prune commands work on one schedule (app/scheduler/keys.py) and touch no
other schedule's rows: the one ``--schedule`` names; else the one the app runs, the
app being ``--app`` or REGENT_APP (the same one `python -m app` serves, found inside
ASGI middleware too: app/app_target.py): the name its Scheduler is given in code
(``Scheduler(name=...)``), else the SCHEDULER_NAME of the Settings it was built with
(``create_app(Settings(SCHEDULER_NAME=...))``); else SCHEDULER_NAME (``default`` unless
set). Every confirmation names the schedule.

They talk to the database (DATABASE_URL, or the embedded server of a running
`python -m app`) through the same queries as the admin API, and print plain tables that
read like the admin page (see app/operations/display.py): one line per row, timestamps in UTC
to the second, yes/no, durations with their unit. Every value from data is printed
through app/printable.py, so a control character in a key or an error is shown as an
escape, never sent to the terminal.

One module per command group (jobs.py, outbox.py, leader.py, prune.py), each adding
its sub-parser and running its command; options.py holds the options they share
(--schedule, --app, --json) and which schedule they name, output.py the tables, JSON
and printing, errors.py what a command refuses, and commands.py puts the groups
together: the sub-commands, the database they reach, the run of one.
"""
