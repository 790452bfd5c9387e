"""``pii``: email and IP addresses replaced by a fixed placeholder (the text is kept; how many of each were replaced
is counted in the stats and the manifest under ``modified``).

The patterns are datatrove's PIIFormatter's (an RFC 5322-style address; dotted-quad IPv4 addresses, by default only
public ones: ``ipaddress``'s ``is_global``, so 10.x, 192.168.x, 127.x and documentation ranges stay). Unlike
datatrove, which cycles through several example addresses, every match gets the same placeholder: the output
does not depend on the order documents are processed in.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from data_prep.steps.doc_steps import Doc, DocStep

EMAIL = re.compile(
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
# Cheap scans first: an address needs a character of its local part before "@" and a domain character after it;
# an IPv4 address needs three dots between digits. Most documents have neither, and skip the full patterns.
MAYBE_EMAIL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]@[A-Za-z0-9\[]")
MAYBE_IPV4 = re.compile(r"\d\.\d{1,3}\.\d{1,3}\.\d")


class PiiConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: Optional[Literal["mask"]] = "mask"
    ip: Optional[Literal["mask"]] = "mask"
    public_ips_only: bool = True
    email_placeholder: str = "email@example.com"
    ip_placeholder: str = "0.0.0.0"


class PiiMasker(DocStep):
    def __init__(self, cfg: PiiConfig):
        super().__init__(cfg)

    def _ip(self, m: "re.Match") -> str:
        try:
            if self.cfg.public_ips_only and not ipaddress.ip_address(m.group(0)).is_global:
                return m.group(0)
        except ValueError:
            return m.group(0)
        self.modified["ip"] += 1
        return self.cfg.ip_placeholder

    def apply(self, doc: Doc) -> Optional[str]:
        text = doc.text
        if self.cfg.email and "@" in text and MAYBE_EMAIL.search(text):
            text, n = EMAIL.subn(self.cfg.email_placeholder, text)
            self.modified["email"] += n
        if self.cfg.ip and MAYBE_IPV4.search(text):
            text = IPV4.sub(self._ip, text)
        doc.text = text
        return None
