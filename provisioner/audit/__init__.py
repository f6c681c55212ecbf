"""`provision audit`: checks of what apply set, on our hosts and on servers we did not build.

expectations   what each host should have (spec mode: the roles' own variables and templates;
               profile mode: a profile of recommended values applied to what discovery found)
checks/        the checks, one module per concern: the facts it reads and the rows it compares
registry       how a check is declared (@check, @each) and the Audit it compares with
engine         reads a host's facts in one SSH round trip and runs every check on them, in process
runner         connects to the hosts (one SSH master each, all in parallel), returns one report per host
pytest_plugin  the same checks as pytest tests over testinfra's --hosts (the testinfra way)
report         Rich tables, JUnit XML and JSON
"""
