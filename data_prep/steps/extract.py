"""``extract``: the text of HTML pages, by resiliparse's main-content extraction (compiled; the lexbor HTML parser),
line breaks and paragraphs preserved, scripts, styles, navigation and boilerplate left out.

``from: html``: the record's text field holds the page's HTML (a jsonl/parquet of crawled pages); ``from: warc``:
the inputs are WARC files (.warc, .warc.gz; read/warc.py gives each HTML response as a record: url, WARC record id
and date, and the decoded HTML as the text field). A page with no text left is removed (``no_text``); the extracted
text replaces the HTML, so the later steps (language, quality, dedup) see text, as FineWeb's pipeline runs them.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from data_prep.steps.doc_steps import Doc, DocStep


class ExtractConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_: Literal["html", "warc"] = Field(alias="from", description="html: the text field is HTML; warc: WARC inputs")
    main_content: bool = Field(True, description="only the main content (no menus, footers, comments sections)")
    links: bool = False
    alt_texts: bool = False


class Extractor(DocStep):
    def __init__(self, cfg: ExtractConfig):
        super().__init__(cfg)
        from resiliparse.extract.html2text import extract_plain_text

        self.extract = extract_plain_text

    def apply(self, doc: Doc) -> Optional[str]:
        c = self.cfg
        text = self.extract(doc.text, preserve_formatting=True, main_content=c.main_content, links=c.links,
                            alt_texts=c.alt_texts, list_bullets=True, comments=False)
        text = text.strip()
        if not text:
            return "no_text"
        doc.text = text
        return None
