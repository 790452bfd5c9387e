"""Planted-data corpora for the curation step tests: unrelated English documents that every step keeps untouched,
with documents or passages planted to be removed or rewritten, and the exact outcome written down beside them."""

import numpy as np
import orjson

NOUNS = ("house river garden teacher market window letter village bridge forest doctor engine island castle kitchen "
         "student summer winter mountain ocean harbour station library painter farmer orchard valley").split()
ADJ = "quiet bright old small famous green careful heavy simple strange warm narrow".split()
VERB = "carry open follow build clean visit paint watch answer describe".split()

FRENCH = ("Le petit village se trouve au bord de la rivière et les enfants jouent dans le jardin tous les jours.\n"
          "La maison de mon grand-père est très ancienne, mais elle reste belle et chaleureuse en hiver.\n"
          "Nous avons mangé du pain frais avec du fromage et nous avons bu un verre de vin rouge ensemble.\n"
          "Les habitants de la région parlent souvent de leur histoire et de leurs traditions anciennes.\n"
          "Demain matin, nous irons au marché pour acheter des légumes et des fruits pour toute la semaine.")
GERMAN = ("Das kleine Dorf liegt am Ufer des Flusses und die Kinder spielen jeden Tag im großen Garten.\n"
          "Das Haus meines Großvaters ist sehr alt, aber es ist im Winter immer noch schön und warm.\n"
          "Wir haben frisches Brot mit Käse gegessen und zusammen ein Glas Rotwein getrunken.\n"
          "Die Menschen in dieser Gegend sprechen oft über ihre Geschichte und ihre alten Traditionen.\n"
          "Morgen früh gehen wir auf den Markt, um Gemüse und Obst für die ganze Woche zu kaufen.")


class Prose:
    """Unrelated English sentences (random slots), so no two documents share a sentence by chance."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def sentence(self) -> str:
        r = self.rng
        n, a, v, k = (lambda: r.choice(NOUNS)), (lambda: r.choice(ADJ)), (lambda: r.choice(VERB)), r.integers(2, 999)
        return [f"The {a()} {n()} of the {n()} was near the {n()}, and the {n()} had to {v()} it with {k} friends.",
                f"Every {n()} in the {a()} {n()} wanted to {v()} a {n()} before {k} days had passed.",
                f"Yesterday {k} people saw how a {a()} {n()} could {v()} the {n()} that stood by the {n()}.",
                f"Nobody knew why the {n()} and its {a()} {n()} would {v()} {k} letters to a {n()}."][r.integers(4)]

    def doc(self, sentences: int = 8) -> str:
        return "\n".join(self.sentence() for _ in range(sentences))


def write_records(path, records):
    """Write jsonl; returns each record's byte offset (the removal log's position)."""
    offsets, at = [], 0
    with open(path, "wb") as f:
        for r in records:
            line = orjson.dumps(r) + b"\n"
            f.write(line)
            offsets.append(at)
            at += len(line)
    return offsets


def read_output(out, manifest):
    """Every kept record of a curate output, in order."""
    recs = []
    for entry in manifest["files"]:
        with open(out / entry["file"], "rb") as f:
            recs += [orjson.loads(line) for line in f]
    return recs


def removals(out):
    with open(out / "removed.jsonl", "rb") as f:
        return [orjson.loads(line) for line in f]
