from trainer.script.wrapper import run_as_main

run_as_main()
