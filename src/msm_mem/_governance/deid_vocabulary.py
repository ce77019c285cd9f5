"""The vocabulary of the de-identification rules: word lists and regular-expression fragments.

Tables only, no logic: :mod:`msm_mem._governance.deid_rules` assembles them into rules. Each
fragment is a non-capturing group unless it names a group (``v`` is the identifier's value).
"""

from __future__ import annotations

__all__ = [
    "AGE",
    "BY_CUE",
    "CAPS",
    "COUNTRIES",
    "CREDENTIAL",
    "DAY",
    "GIVEN",
    "GIVEN_NAMES",
    "GIVEN_UPPER",
    "ISO_TIME",
    "LO",
    "MONTH",
    "NAMES",
    "NAME_CUE",
    "NOT_NAMES",
    "NUM_END",
    "NW",
    "OCTET",
    "OPT_TITLE",
    "PART",
    "PLACE_SUFFIXES",
    "ROLE",
    "STATES",
    "STREET",
    "ST_AMBIG",
    "ST_CLEAR",
    "ST_ZIP",
    "TITLE",
    "TLD",
    "UP",
    "URL_END",
    "VALUE",
    "YEAR",
]

MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?"
    r"|JAN(?:UARY)?|FEB(?:RUARY)?|MAR(?:CH)?|APR(?:IL)?|MAY|JUNE?|JULY?|AUG(?:UST)?"
    r"|SEP(?:T(?:EMBER)?)?|OCT(?:OBER)?|NOV(?:EMBER)?|DEC(?:EMBER)?)\b\.?"
)
DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
YEAR = r"(?:1[89]\d\d|20\d\d)"
STATES = (
    "Alabama|Alaska|Arizona|Arkansas|California|Colorado|Connecticut|Delaware|Florida|Georgia|"
    "Hawaii|Idaho|Illinois|Indiana|Iowa|Kansas|Kentucky|Louisiana|Maine|Maryland|Massachusetts|"
    "Michigan|Minnesota|Mississippi|Missouri|Montana|Nebraska|Nevada|New Hampshire|New Jersey|"
    "New Mexico|New York|North Carolina|North Dakota|Ohio|Oklahoma|Oregon|Pennsylvania|"
    "Rhode Island|South Carolina|South Dakota|Tennessee|Texas|Utah|Vermont|Virginia|Washington|"
    "West Virginia|Wisconsin|Wyoming|District of Columbia"
)
# Two-letter codes that are also common clinical abbreviations count only before a ZIP code.
ST_CLEAR = "AK|AZ|CA|DC|FL|IA|IL|KS|KY|MA|MN|MT|NC|NH|NJ|NM|NV|NY|OH|RI|TN|TX|UT|VT|WA|WI|WV|WY"
ST_AMBIG = "AL|AR|CO|CT|DE|GA|HI|ID|IN|LA|MD|ME|MI|MO|MS|ND|NE|OK|OR|PA|SC|SD|VA"
COUNTRIES = (
    "Argentina|Australia|Austria|Belgium|Brazil|Canada|Chile|China|Colombia|Denmark|Egypt|"
    "England|Finland|France|Germany|Greece|Hong Kong|India|Indonesia|Iran|Iraq|Ireland|Israel|"
    "Italy|Japan|Korea|Macau|Malaysia|Mexico|Netherlands|New Zealand|Nigeria|Norway|Pakistan|"
    "Peru|Philippines|Poland|Portugal|Russia|Saudi Arabia|Scotland|Singapore|South Africa|"
    "South Korea|Spain|Sweden|Switzerland|Taiwan|Thailand|Turkey|UK|USA|U\\.S\\.A?\\.?|"
    "United Kingdom|United States|Vietnam|Wales"
)
NOT_NAMES = frozenset(
    """A An The This That These Those He She His Her Hers They Their It Its We Our I You Who
    Which What When Where Was Were Is Are Be Been Had Has Have Did Does Do And Or But Nor Of
    In On At To For From By With Without As Not No Yes None Unknown Also Then After Before
    During Patient Patients Pt Doctor Nurse Hospital Clinic Department Emergency General
    Practitioner Medical Medicine Center Centre University Unit Ward Room Care Intensive
    Team Service Radiology Radiologist Radiopaedia Imaging Notes Note Discussion Presentation
    History Findings Finding Impression Report Diagnosis Case Figure Fig Table Day Days Week
    Weeks Month Months Year Years Today Yesterday Tomorrow Morning Evening Night Chest Lung
    Lungs Left Right Bilateral Upper Lower Normal Positive Negative Covid Coronavirus
    Pneumonia Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February
    March April May June July August September October November December Male Female Man
    Woman Boy Girl Mother Father Son Daughter Wife Husband Brother Sister Family Dr Drs Dra Mr
    Mrs Ms Mx Miss Prof Sr Sra Srta Professor Assoc Associate Assistant Consultant""".split()
)
UP, LO = "A-ZÀ-ÖØ-ÞĀ-Ž", "a-zß-öø-ÿĀ-ž"  # Latin-1 and Latin Extended-A letters
NW = (
    rf"(?:(?:Mc|Mac|O['’])[{UP}][{LO}]+|[{UP}][{LO}]*[{UP}][{LO}]+"
    rf"|[{UP}][{LO}]+(?:['’-][{UP}]?[{LO}]+)*)(?!\w)"
)
PART = r"(?:(?:van|von|de|da|del|der|di|du|le|la|dos|bin|ibn|al)\s+)"
NAMES = rf"(?:[A-Z]\.\s*)*{NW}(?:\s+(?:[A-Z]\.?\s+)?{PART}?{NW}){{0,3}}"
CAPS = r"[A-Z]{2,}(?:['’-][A-Z]{2,})?(?:\s+[A-Z]{2,}){0,2}\b"
TITLE = r"(?<![\w.])(?:Dr|Drs|Dra|Mr|Mrs|Ms|Mx|Miss|Prof|Sr|Sra|Srta|Doctor|Professor)\.?\s+"
VALUE = r"(?P<v>(?=[A-Za-z0-9-]*\d)[A-Za-z0-9]+(?:[-/.][A-Za-z0-9]+)*(?:[ -]\d{3,})*)"
PLACE_SUFFIXES = frozenset(
    "Hospital Medical Clinic Infirmary Health Nursing Hospice County Parish Borough Township Precinct".split()
)
ST_ZIP = rf"(?:{ST_CLEAR}|{ST_AMBIG}|{STATES})"
STREET = (
    r"(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Way"
    r"|Terrace|Parkway|Pkwy|Highway|Hwy|Circle|Square|Sq|Trail|Alley|Crescent|Close|Plaza)"
)
URL_END = r"[^\s<>\"'\[\]]*[^\s<>\"'\[\].,;:!?)]"
TLD = (
    r"(?:com|org|net|edu|gov|mil|info|io|co\.uk|ac\.uk|nhs\.uk|de|fr|es|it|nl|ca|au|cn|jp|kr"
    r"|br|ch|se|eu|health)"
)
OCTET = r"(?:25[0-5]|2[0-4]\d|1?\d?\d)"
AGE = r"(?:9\d|1[01]\d)"
NAME_CUE = (
    r"\b(?:[Pp]atient|[Pp]t\.?|[Cc]lient|[Rr]esident|[Ww]ife|[Hh]usband|[Ss]on|[Dd]aughter"
    r"|[Mm]other|[Ff]ather|[Bb]rother|[Ss]ister|[Ss]pouse|[Pp]artner|[Gg]uardian|[Ff]riend"
    r"|[Cc]aregiver|(?<!-)[Nn]amed|(?<!-)[Cc]alled)\b"
)
BY_CUE = (
    r"\b(?:[Ss]igned|[Dd]ictated|[Rr]eviewed|[Ss]een|[Ee]xamined|[Rr]eferred|[Rr]eported"
    r"|[Tt]ranscribed|[Aa]pproved|[Ww]ritten|[Tt]reated|[Cc]ourtesy)\s+(?:by|of)\s*:?\s*"
)
ROLE = (
    r"\b(?:[Aa]ttending|[Pp]hysician|[Rr]adiologist|[Ss]urgeon|PCP|[Pp]rovider|[Cc]onsultant"
    r"|[Nn]urse|[Cc]ontact|[Nn]ext of kin|NOK|[Ss]ignature|[Aa]uthor)\s*[:=]\s*"
)
OPT_TITLE = r"(?:(?:Dr|Prof|Mr|Mrs|Ms)\.?\s+)?"
CREDENTIAL = r"(?:MD|M\.D\.|PhD|Ph\.D\.|RN|NP|MBBS|FRCR|FRCPC?|FACR|DNP|PA-C)(?![\w.]|\.\w)"
ISO_TIME = r"(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
NUM_END = r"(?![\d/.-]?\d)"

# Common given names, for names without a cue ("Johnathan Q. Smithers", "Smithers, Maria").
# Names that are also English words, months, places or clinical eponyms (May, Grace, Will,
# Jordan, Georgia, Addison...) are left out so that clinical text is never taken for a name.
GIVEN_NAMES = frozenset(
    """Aaron Abigail Adam Ahmed Aisha Alan Albert Alexander Alexis Alice Amanda Amit Amy Ana
    Andrea Andrew Angela Anjali Ann Anna Anthony Arthur Ashley Astrid Ava Barbara Benjamin Betty
    Beverly Billy Bobby Brandon Brenda Brian Brittany Bruce Bryan Carl Carlos Carmen Carol
    Carolyn Catherine Charles Charlotte Cheryl Chloe Christina Christine Christopher Claire
    Cynthia Daniel Danielle David Debra Deborah Denise Dennis Diana Diane Dmitri Donald Donna
    Doris Dorothy Douglas Dylan Edward Elijah Elizabeth Emily Emma Eric Erik Ethan Eugene Evelyn
    Fatima Frances Francesca Francesco Gabriel Gary Gerald Giovanni Giulia Gloria Gregory Hannah
    Hans Harold Hassan Heather Helen Henry Hiroshi Ingrid Isabella Isabelle Ivan Jacob Jacqueline
    James Jane Janet Janice Jason Jeffrey Jennifer Jeremy Jerry Jesse Jessica Jian Joan Johanna
    Johannes John Johnathan Johnny Jonathan Jorge Jose Joseph Joshua Joyce Juan Judith Judy Julia
    Julie Justin Karen Katherine Kathleen Kathryn Kayla Keith Kelly Kenneth Kevin Kimberly Klaus
    Kyle Larry Lars Laura Lauren Lawrence Liam Linda Lisa Logan Lori Louis Lucas Lucia Luis
    Madison Margaret Maria Marie Marilyn Martha Mary Matthew Megan Mei Melissa Mia Michael
    Michelle Miguel Mohammed Muhammad Nancy Natalie Natasha Nathan Nicholas Nicole Noah Olga
    Oliver Olivia Omar Pamela Patricia Patrick Paul Pedro Peter Philip Pierre Priya Rachel Rajesh
    Ralph Randy Rebecca Richard Robert Roger Ronald Rosa Russell Ruth Ryan Samantha Samuel Sandra
    Sanjay Sara Sarah Scott Sean Sergei Sharon Shirley Sofia Sophia Sophie Stephanie Stephen
    Steven Susan Sven Takeshi Teresa Terry Theresa Thomas Timothy Tyler Vincent Walter Wayne Wei
    William Willie Yuki Zachary Zoe""".split()
)
GIVEN = r"(?:" + "|".join(sorted(GIVEN_NAMES, key=lambda n: (-len(n), n))) + r")(?![\w'’-])"
GIVEN_UPPER = r"(?:" + "|".join(sorted((n.upper() for n in GIVEN_NAMES), key=lambda n: (-len(n), n))) + r")(?![\w'’-])"
