"""C-Eval (ceval/ceval-exam, one config per subject, val split), zero-shot: ceval_valid.

    doc(row)    a row -> EvalDoc
    SUBJECTS    each subject's config name -> its Chinese name

Followed: lm-eval's ceval-valid task (its _default_ceval_yaml and the per-subject YAMLs
that add a description), as Psyche's CEval also asks it. Row: {"id", "question", "A",
"B", "C", "D", "answer": "A".."D", "explanation"}. Context:

    以下是中国关于{subject's Chinese name}的单项选择题，请选出其中的正确答案。

    {question}
    A. {A}
    ...
    D. {D}
    答案：

choices the letters "A".."D" (scored as " A"), gold the answer's letter; metric acc
(lm-eval computes acc_norm too, but CEval is not in Psyche's TASKS_WITH_ACC_NORM).

The data set's rows do not name their subject: the config they come from does. The
catalog puts that config's name in the row's "subject" field when it reads a Hugging Face
snapshot (the bundled sample writes it too); a row without it gets no description line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client_image.evals.documents import BadDocument, index_of, text
from client_image.evals.scoring import EvalDoc

DATASET = "ceval/ceval-exam"
SPLIT = "val"
SUBJECT_FIELD = "subject"  # not the data set's: the config the row was read from
LETTERS = ("A", "B", "C", "D")

SUBJECTS = {
    "accountant": "注册会计师",
    "advanced_mathematics": "高等数学",
    "art_studies": "艺术学",
    "basic_medicine": "基础医学",
    "business_administration": "工商管理",
    "chinese_language_and_literature": "中国语言文学",
    "civil_servant": "公务员",
    "clinical_medicine": "临床医学",
    "college_chemistry": "大学化学",
    "college_economics": "大学经济学",
    "college_physics": "大学物理",
    "college_programming": "大学编程",
    "computer_architecture": "计算机组成",
    "computer_network": "计算机网络",
    "discrete_mathematics": "离散数学",
    "education_science": "教育学",
    "electrical_engineer": "注册电气工程师",
    "environmental_impact_assessment_engineer": "环境影响评价工程师",
    "fire_engineer": "注册消防工程师",
    "high_school_biology": "高中生物",
    "high_school_chemistry": "高中化学",
    "high_school_chinese": "高中语文",
    "high_school_geography": "高中地理",
    "high_school_history": "高中历史",
    "high_school_mathematics": "高中数学",
    "high_school_physics": "高中物理",
    "high_school_politics": "高中政治",
    "ideological_and_moral_cultivation": "思想道德修养与法律基础",
    "law": "法学",
    "legal_professional": "法律职业资格",
    "logic": "逻辑学",
    "mao_zedong_thought": "毛泽东思想和中国特色社会主义理论体系概论",
    "marxism": "马克思主义基本原理",
    "metrology_engineer": "注册计量师",
    "middle_school_biology": "初中生物",
    "middle_school_chemistry": "初中化学",
    "middle_school_geography": "初中地理",
    "middle_school_history": "初中历史",
    "middle_school_mathematics": "初中数学",
    "middle_school_physics": "初中物理",
    "middle_school_politics": "初中政治",
    "modern_chinese_history": "近代史纲要",
    "operating_system": "操作系统",
    "physician": "医师资格",
    "plant_protection": "植物保护",
    "probability_and_statistics": "概率统计",
    "professional_tour_guide": "导游资格",
    "sports_science": "体育学",
    "tax_accountant": "税务师",
    "teacher_qualification": "教师资格",
    "urban_and_rural_planner": "注册城乡规划师",
    "veterinary_medicine": "兽医学",
}


def doc(row: Mapping[str, Any]) -> EvalDoc:
    lines = [text(row, "question").strip()]
    lines += [f"{letter}. {text(row, letter)}" for letter in LETTERS]
    lines.append("答案：")
    return EvalDoc(context=_description(row) + "\n".join(lines), choices=LETTERS,
                   gold=index_of(LETTERS, text(row, "answer"), "answer"))


def _description(row: Mapping[str, Any]) -> str:
    if row.get(SUBJECT_FIELD) is None:
        return ""
    subject = text(row, SUBJECT_FIELD)
    if subject not in SUBJECTS:
        raise BadDocument(f"field {SUBJECT_FIELD!r} is {subject!r}, not a C-Eval subject")
    return f"以下是中国关于{SUBJECTS[subject]}的单项选择题，请选出其中的正确答案。\n\n"
