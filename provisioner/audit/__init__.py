"""`provision audit`: testinfra checks of what apply set, on our hosts and on servers we did not build.

expectations  what each host should have (spec mode: the roles' own variables and templates;
              profile mode: a profile of recommended values applied to what discovery found)
suite/        the testinfra checks, run by pytest in a subprocess, parameterized from the expectations
plugin        the pytest plugin that collects each check's expected, actual and status
runner        connects to the hosts (one SSH master each), runs the suite, returns one report per host
report        Rich tables, JUnit XML and JSON
"""
