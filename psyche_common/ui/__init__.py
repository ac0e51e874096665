"""The small UI kit both TUIs use (the run-manager's and the client's `--logs tui`).

    view            RunView (run snapshot + client metrics + loss history), describe_run,
                    describe_wait (what the run waits for), describe_witnesses,
                    describe_training, format_duration, format_bytes
                    (plain text, no Textual: `--no-tui` imports only this)
    run_panel       RunPanel        phase and timer, epoch, step, the clients table
    witness_panel   WitnessPanel    elected witnesses and quorum progress
    training_panel  TrainingPanel   the client's training line and its loss plot

Each panel has `show(view: RunView)`; the panels import Textual, the view does not.
"""
