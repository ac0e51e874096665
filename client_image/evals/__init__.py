"""Benchmark evals of the model being trained, scored as lm-eval scores multiple choice.

    scoring     EvalDoc, encode_pair, score_doc (the summed log-probability of each
                choice), accuracy (acc, acc_norm), greedy_completion (the prompt task)
    catalog     TASKS, TASK_NAMES (Psyche's names), parse_task_names, load_task (a task's
                documents from --eval-data-dir, the Hugging Face cache or the bundled
                sample, sampled with the seed), EvalDataError
    documents   BadDocument and the field checks of the families:
    arc, boolq, ceval, hellaswag, mmlu, mmlu_pro, openbookqa, piqa
                one data set format each: a row -> EvalDoc (mmlu: mmlu and mmlu_cf)

The client runs them while its model is idle between epochs (client_image/runtime/
evaluating.py); docs/evals.md says what is scored and where the data comes from.
"""
