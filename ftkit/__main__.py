from ftkit.cli import run

run()
