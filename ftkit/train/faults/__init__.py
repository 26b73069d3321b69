"""Faults injected on purpose, to prove recovery: ``spec`` is the ``--inject`` grammar (kinds,
named points, ``FaultSpec``, bounds), ``chaos`` the random ``--chaos`` schedule, ``schedule``
both together (what the config validates), ``injector`` the ``FaultInjector`` a process arms
and the named fault points call, ``points`` the injector a process gets (none without faults)."""
