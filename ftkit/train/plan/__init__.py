"""The run plan: what ``ftkit train`` derives from its config (the resolved model, the task's
recipe, the fault schedule, the device), derived once by the command in ``run_plan.build_plan``
and handed down by value to the driver, the rank workers and the engine actors, so that
nothing below the command resolves ``--model`` or re-reads the config's inputs again."""
