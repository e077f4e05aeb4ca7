//! The timeline as a self-contained HTML page (no network): the SVG, its data, and a small
//! script: hover read-out of every panel and the phases under the cursor, wheel to zoom, drag
//! to pan, double-click to reset. [`script`] is the same for a page that embeds the timeline.

use super::draw::{esc, Picture};

/// The page of one timeline.
pub fn page(p: &Picture) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>gpumemtrace timeline: {}</title>\n<style>{CSS}</style></head>\n<body>\n{}</body></html>\n",
        esc(&p.exe),
        embed(p)
    )
}

/// The timeline as a fragment of a page: help line, SVG, tooltip and script. Needs [`CSS`].
pub fn embed(p: &Picture) -> String {
    format!(
        "<div id=\"help\">wheel: zoom · drag: pan · double-click: reset · hover: values</div>\n<div id=\"wrap\">{}<div id=\"tip\"></div></div>\n<script>{}</script>\n",
        p.svg,
        script(p)
    )
}

/// The script, with the picture's data.
pub fn script(p: &Picture) -> String {
    format!("const DATA = {};\n{JS}", p.data.to_string().replace("</", "<\\/"))
}

pub const CSS: &str = r#"body{margin:12px;font-family:DejaVu Sans,Helvetica,Arial,sans-serif;background:#fff}
#help{color:#666;font-size:12px;margin-bottom:4px}#wrap{position:relative;display:inline-block}
#tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.95);border:1px solid #999;padding:4px 6px;font-size:12px;display:none;white-space:pre}
.cursor{stroke:#333;stroke-dasharray:2,2;pointer-events:none}"#;

/// Zoom and pan by the plots' viewBox; overlay marks, phase labels and the time axis follow.
/// Hover reads the embedded data.
const JS: &str = r##"(function(){
const svg=document.getElementById('gmt'),tip=document.getElementById('tip');
const W=DATA.plot_w,END=DATA.end_ns,LEFT=DATA.left;
let t0=0,t1=END;
const X=t=>(t-t0)/(t1-t0)*W;
const fmtB=b=>{const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(b>=1024&&i<4){b/=1024;i++}return i?b.toFixed(1)+' '+u[i]:b+' B'};
function niceStep(span){const raw=span/8,m=Math.pow(10,Math.floor(Math.log10(raw)));for(const k of [1,2,5,10])if(raw<=k*m)return k*m;return 10*m}
function redraw(){
  const vx=t0/END*W,vw=(t1-t0)/END*W;
  svg.querySelectorAll('svg.plot').forEach(p=>{const h=p.viewBox.baseVal.height;p.setAttribute('viewBox',vx+' 0 '+vw+' '+h)});
  svg.querySelectorAll('g.peak,g.failure').forEach(g=>{const t=+g.dataset.t,x=X(t);
    const m=/translate\([^,]+,([^)]+)\)/.exec(g.getAttribute('transform'));
    g.setAttribute('transform','translate('+x+','+m[1]+')');g.style.display=(x<0||x>W)?'none':''});
  svg.querySelectorAll('text.phase-label').forEach(l=>{const a=X(+l.dataset.t0),b=X(+l.dataset.t1);
    l.setAttribute('x',Math.max(a,0)+3);l.style.display=(b<0||a>W||(Math.min(b,W)-Math.max(a,0))<l.textContent.length*7+6)?'none':''});
  svg.querySelectorAll('g.xaxis').forEach(ax=>{
    const s0=t0/1e9,s1=t1/1e9,st=niceStep(s1-s0),dec=st>=1?0:Math.ceil(-Math.log10(st)-1e-9);
    let h='';for(let k=Math.ceil(s0/st)*st;k<=s1+st*1e-9;k+=st){const x=(k-s0)/(s1-s0)*W;
      h+='<line x1="'+x+'" x2="'+x+'" y1="0" y2="5" stroke="#444"/><text x="'+x+'" y="18" text-anchor="middle" fill="#444">'+k.toFixed(dec)+' s</text>'}
    ax.innerHTML=h});
}
function tAt(ev){const r=svg.getBoundingClientRect(),x=(ev.clientX-r.left)*(svg.viewBox.baseVal.width/r.width)-LEFT;return {x,t:t0+x/W*(t1-t0)}}
svg.addEventListener('wheel',ev=>{const {x,t}=tAt(ev);if(x<0||x>W)return;ev.preventDefault();
  const f=ev.deltaY<0?0.8:1.25;let n0=t-(t-t0)*f,n1=t+(t1-t)*f;if(n1-n0>=END){n0=0;n1=END}
  if(n1-n0<1000)return;if(n0<0){n1-=n0;n0=0}if(n1>END){n0-=n1-END;n1=END}t0=n0;t1=n1;redraw()},{passive:false});
let drag=null;
svg.addEventListener('mousedown',ev=>{drag={x:ev.clientX,t0,t1}});
window.addEventListener('mouseup',()=>{drag=null});
svg.addEventListener('dblclick',()=>{t0=0;t1=END;redraw()});
const cursor=document.createElementNS('http://www.w3.org/2000/svg','line');cursor.setAttribute('class','cursor');svg.appendChild(cursor);
const at=(pts,t)=>{let v=null;for(const q of pts){if(q[0]<=t)v=q;else break}return v};
const val=v=>v?(v[1]==v[2]?fmtB(v[3]):fmtB(v[3])+' (range '+fmtB(v[1])+' to '+fmtB(v[2])+')'):'0 B';
svg.addEventListener('mousemove',ev=>{
  if(drag){const r=svg.getBoundingClientRect(),dt=(ev.clientX-drag.x)*(svg.viewBox.baseVal.width/r.width)/W*(drag.t1-drag.t0);
    let n0=drag.t0-dt,n1=drag.t1-dt;if(n0<0){n1-=n0;n0=0}if(n1>END){n0-=n1-END;n1=END}t0=n0;t1=n1;redraw();}
  const {x,t}=tAt(ev);if(x<0||x>W){tip.style.display='none';cursor.setAttribute('x1',-10);cursor.setAttribute('x2',-10);return}
  let lines=['t = '+(t/1e9).toFixed(6)+' s'];
  for(const p of DATA.panels){lines.push(p.title+': '+val(at(p.points,t)));
    if(p.reserved.length)lines.push('  reserved: '+val(at(p.reserved,t)))}
  const ph=[];for(const r of svg.querySelectorAll('rect.phase-bar')){const a=+r.getAttribute('x'),b=a+ +r.getAttribute('width'),px=t/END*W;
    if(px>=a&&px<=b)ph.push([+r.dataset.lane,r.dataset.name+(+r.dataset.spans>1?' ('+r.dataset.spans+' spans)':'')])}
  ph.sort((a,b)=>a[0]-b[0]);
  if(ph.length)lines.push('phase: '+ph.map(p=>p[1]).join(' > '));
  tip.textContent=lines.join('\n');tip.style.display='block';
  const wr=document.getElementById('wrap').getBoundingClientRect();
  tip.style.left=(ev.clientX-wr.left+14)+'px';tip.style.top=(ev.clientY-wr.top+14)+'px';
  const sx=LEFT+x;cursor.setAttribute('x1',sx);cursor.setAttribute('x2',sx);cursor.setAttribute('y1',60);cursor.setAttribute('y2',svg.viewBox.baseVal.height-30)});
svg.addEventListener('mouseleave',()=>{tip.style.display='none'});
})();"##;
