from combos import Combo, run_combo
def test_proto(home):
    c = Combo("batch", 1, True, 0, "fresh", True, "openai")
    out = run_combo(home, c)
    for r in out.results[0][:3]: print(r)
    print(out.status[0]["failed"], out.report[0]["rows"])
