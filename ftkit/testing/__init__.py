"""Test and benchmark support (generators of realistic inputs); no command imports it."""
