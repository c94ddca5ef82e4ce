"""Wall seconds of every Snakemake job, read from what Snakemake printed (job start stamps and `Finished jobid`).

    python tools/gpu/job_seconds.py make-run.log [more logs of the same run, in order]
"""
import datetime as dt
import re
import sys


def parse(paths):
    start={}; rows=[]
    for p in paths:
        ts=None; cur=None
        for line in open(p):
            line=line.rstrip('\n')
            m=re.match(r'^\[(\w{3} \w{3}\s+\d+ \d\d:\d\d:\d\d \d{4})\]$',line)
            if m: ts=dt.datetime.strptime(m.group(1),'%a %b %d %H:%M:%S %Y'); continue
            m=re.match(r'^local(rule|checkpoint) (\w+):',line)
            if m: cur={'rule':m.group(2),'t0':ts,'wc':''}; continue
            m=re.match(r'\s+jobid: (\d+)',line)
            if m and cur: start[(p,m.group(1))]=cur; cur['id']=m.group(1); continue
            m=re.match(r'\s+wildcards: (.*)',line)
            if m and cur: cur['wc']=m.group(1); continue
            m=re.match(r'Finished jobid: (\d+) \(Rule: (\w+)\)',line)
            if m and (p,m.group(1)) in start:
                s=start[(p,m.group(1))]; rows.append((s['rule'],s['wc'],(ts-s['t0']).total_seconds()))
    return rows
rows=parse(sys.argv[1:])
tr=[r for r in rows if r[0]=='train']
print(len(tr),'train jobs, sum',sum(r[2] for r in tr),'s, mean',sum(r[2] for r in tr)/max(1,len(tr)))
for r in sorted(rows,key=lambda r:-r[2])[:60]: print(r)
