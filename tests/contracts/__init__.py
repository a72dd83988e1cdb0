"""Contract suites: each module holds base classes of test methods, one per contract, that no test
module collects by itself (their names do not start with ``Test``). A test module subclasses a base
once per implementation (``class TestCasOnGcs(CasContract)``) and gives it the fixtures it asks for;
every method of the base then runs against that implementation, and pytest names each run
``TestCasOnGcs::test_...``. An implementation's own checks stay as extra methods of its subclass or
as plain tests beside it."""
